"""The desk's forms: the queue's filters, a bulk decision, and the edit of a call's
arguments converted by the tool's schema (`EditArgumentsForm`)."""

from __future__ import annotations

import re

from django import forms

from approvals.decisions.queue import QueueCursor
from approvals.models import ApprovalRequest, GateRule
from tools.inputs import UnsafeJSON, finite_decimal, parse_json
from tools.registry import ToolSpec, input_hash

# The queue's tabs: what the user may decide now, and everything waiting they may see.
YOURS, ALL = "yours", "all"


class QueueFilterForm(forms.Form):
    """The queue's tab, filters and search: a GET form, every field optional.

    Query strings are typed by hand and by scripts: a value that does not
    validate is left out, and the reviewer is told which and why.
    """

    tab = forms.ChoiceField(
        required=False,
        choices=[(YOURS, "Yours to decide"), (ALL, "All waiting")],
        error_messages={"invalid_choice": "there is no tab %(value)s: yours or all."},
    )
    # Free text over the task, the tool, the arguments and the run id ("#12").
    q = forms.CharField(required=False, max_length=200, label="Search")
    # As long as the columns they are compared with (ToolCall.tool_name, Run.agent).
    tool = forms.CharField(required=False, max_length=100)
    agent = forms.CharField(required=False, max_length=100)
    # Any rule, not only those that gate today: a pending approval keeps the rule
    # that opened it even if that rule was disabled or changed since.
    rule = forms.ModelChoiceField(
        required=False,
        queryset=GateRule.objects.all(),
        error_messages={"invalid_choice": "there is no such gate rule."},
    )
    mine = forms.BooleanField(required=False)
    unclaimed = forms.BooleanField(required=False)
    # What the request is about: a gated call, or a guard that stopped a run.
    kind = forms.ChoiceField(required=False, choices=[("", "any"), *ApprovalRequest.Kind.choices])

    # Where the page starts: a cursor from the queue's own links (the page after or
    # before an item, ``QueueCursor``), or a page number (older links; read by offset).
    after = forms.CharField(required=False, max_length=60)
    before = forms.CharField(required=False, max_length=60)
    page = forms.IntegerField(required=False, min_value=1, max_value=10**6)

    def clean_after(self) -> QueueCursor | None:
        return self._cursor("after")

    def clean_before(self) -> QueueCursor | None:
        return self._cursor("before")

    def _cursor(self, name: str) -> QueueCursor | None:
        text = self.cleaned_data[name].strip()
        if not text:
            return None
        cursor = QueueCursor.parse(text)
        if cursor is None:
            raise forms.ValidationError("this link into the queue is broken; the first page is shown.")
        return cursor

    def position(self) -> tuple[str, QueueCursor | int] | None:
        """Where the page starts, if not at the top: ("after" | "before", cursor) or
        ("page", number). A cursor wins over a page number."""
        if self.is_bound:
            self.is_valid()
        data = getattr(self, "cleaned_data", {})
        for name in ("after", "before"):
            if data.get(name) is not None:
                return name, data[name]
        if data.get("page") and data["page"] > 1:
            return "page", data["page"]
        return None

    def clean_q(self) -> str:
        # A NUL byte is no text anyone searches for (and PostgreSQL refuses it).
        return self.cleaned_data["q"].replace("\x00", "").strip()

    def filters(self) -> dict:
        """Keyword arguments for ``queue_pending`` from the fields that validated."""
        data = {}
        if self.is_bound:
            self.is_valid()  # an invalid field is left out of cleaned_data; problems() says why
            data = self.cleaned_data
        return {
            "yours": self.shown_tab == YOURS,
            "q": data.get("q") or "",
            "tool": data.get("tool") or "",
            "agent": data.get("agent") or "",
            "rule": data.get("rule"),
            "mine": bool(data.get("mine")),
            "unclaimed": bool(data.get("unclaimed")),
            "kind": data.get("kind") or "",
        }

    @property
    def shown_tab(self) -> str:
        """The tab shown: "yours" unless "all" was asked for (and validated)."""
        if self.is_bound:
            self.is_valid()
        return ALL if getattr(self, "cleaned_data", {}).get("tab") == ALL else YOURS

    def applied(self, *, tab: bool = True) -> dict[str, str]:
        """The tab (unless ``tab`` is False, or it is the default) and the filters in
        force, as query parameters (for the page's links and its form)."""
        filters = self.filters()
        applied = {"tab": ALL} if tab and self.shown_tab == ALL else {}
        if filters["q"]:
            applied["q"] = filters["q"]
        applied.update({name: filters[name] for name in ("kind", "tool", "agent") if filters[name]})
        if filters["rule"] is not None:
            applied["rule"] = str(filters["rule"].pk)
        applied.update({name: "1" for name in ("mine", "unclaimed") if filters[name]})
        return applied

    def problems(self) -> list[str]:
        """What was left out, one sentence per field."""
        problems = []
        for name, errors in self.errors.items():
            if name in ("after", "before", "page"):
                # Not a filter: where the page starts. A page number that is not one is
                # passed over as Django's paginator always did (the first page).
                if name != "page":
                    problems.append(f"The queue was shown from the top: {' '.join(errors)}")
            else:
                problems.append(f"{self[name].label} filter ignored: {' '.join(errors)}")
        return problems


# How many items one bulk decision may take: a page of the queue and then some.
BULK_LIMIT = 100
# What a row's checkbox posts: the approval's id and the hash of the arguments it showed.
BULK_ITEM = re.compile(r"(\d{1,18}):([0-9a-f]{0,64})")


class BulkDecisionForm(forms.Form):
    """A bulk decision as the queue posts it: the button pressed, one message to the
    model (``comment``: a decline's reason), one note for the record, and the rows
    ticked ("id:args_hash" each)."""

    decision = forms.ChoiceField(
        choices=[("approve", "Approve selected"), ("decline", "Decline selected")],
        error_messages={
            "required": "Choose approve or decline.",
            "invalid_choice": "Choose approve or decline.",
        },
    )
    comment = forms.CharField(required=False, max_length=5000, strip=True)
    note = forms.CharField(required=False, max_length=5000, strip=True)
    # Approve: the person saw the confirmation (what will be approved, what is left
    # out) and pressed its button; without it an approve only shows that confirmation.
    confirmed = forms.BooleanField(required=False)

    def __init__(self, data=None, *args, **kwargs):
        super().__init__(data, *args, **kwargs)
        # The ticked rows: many values under one name.
        self.raw_items = data.getlist("item") if data is not None else []

    def clean(self):
        cleaned = super().clean()
        items, seen = [], set()
        for raw in self.raw_items:
            match = BULK_ITEM.fullmatch(raw.strip())
            if match is None:
                raise forms.ValidationError("A selected item is not one the queue shows; reload the queue.")
            approval_id = int(match[1])
            if approval_id not in seen:  # the same row twice is decided once
                seen.add(approval_id)
                items.append((approval_id, match[2]))
        if not items:
            raise forms.ValidationError("Select at least one item.")
        if len(items) > BULK_LIMIT:
            raise forms.ValidationError(
                f"At most {BULK_LIMIT} items at a time ({len(items)} were selected); nothing was decided."
            )
        if cleaned.get("decision") == "decline" and not cleaned.get("comment"):
            raise forms.ValidationError(
                "A decline needs a reason: the model is told it. Nothing was decided."
            )
        cleaned["items"] = items
        return cleaned

    @property
    def ticked(self) -> set[int]:
        """The ids of the rows that were ticked (to tick them again when the form comes
        back with an error: nothing is lost)."""
        return {int(m[1]) for raw in self.raw_items if (m := BULK_ITEM.fullmatch(raw.strip()))}


# A schema property the form did not post: the argument keeps what was shown.
NOT_POSTED = object()


class ArgumentField(forms.Field):
    """One argument as typed in the edit form, converted by its schema ``type``:
    numbers (an integer only if whole), objects and arrays as JSON, anything else
    as the text typed (blanks and newlines kept)."""

    def __init__(self, schema_type: str, **kwargs) -> None:
        super().__init__(required=False, **kwargs)
        self.schema_type = schema_type

    def to_python(self, value):
        if value is None:
            return NOT_POSTED
        try:
            if self.schema_type in ("number", "integer"):
                return self._number(value)
            if self.schema_type in ("object", "array"):
                return parse_json(value)
        except UnsafeJSON as exc:
            raise forms.ValidationError(str(exc)) from None
        return value

    def _number(self, raw: str):
        number = finite_decimal(raw)
        whole = number == number.to_integral_value()
        if self.schema_type == "integer" and not whole:
            raise UnsafeJSON(f"{raw.strip()} is not a whole number")
        return int(number) if whole else float(number)


class EditArgumentsForm(forms.Form):
    """The desk's "approve these arguments": one ``arg-<name>`` field per property of
    the tool's schema, each converted by its type (``ArgumentField``). Valid, its
    ``cleaned_data`` is the edited arguments (a property not posted keeps what is
    shown; one the schema does not name is left out) and ``edited`` them, or None if
    they are what is shown. Unusable values are form errors (``refusal`` says the
    first); whether the arguments may run is the service's to say."""

    def __init__(self, spec: ToolSpec | None, shown, data) -> None:
        super().__init__(data, prefix="arg")
        self.shown = shown if isinstance(shown, dict) else {}
        properties = spec.input_schema.get("properties", {}) if spec else {}
        for name, schema in properties.items():
            self.fields[name] = ArgumentField(schema.get("type", "string"))

    def clean(self) -> dict:
        typed = super().clean()
        arguments = {}
        for name in self.fields:
            if name not in typed:
                continue  # refused: its error says why
            if typed[name] is not NOT_POSTED:
                arguments[name] = typed[name]
            elif name in self.shown:
                arguments[name] = self.shown[name]
        return arguments

    @property
    def edited(self) -> dict | None:
        arguments = self.cleaned_data
        return None if input_hash(arguments) == input_hash(self.shown) else arguments

    def refusal(self) -> str:
        """The first unusable value, in a sentence ("amount: 1e308 is not ...")."""
        name, errors = next(iter(self.errors.items()))
        return f"{name}: {errors[0].rstrip('.')}."
