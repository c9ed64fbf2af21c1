#!/usr/bin/env python
"""Stuck detection: does the progress guard stop runs that loop, and leave healthy runs alone?

Run from the project root:  .venv/bin/python bench/stuck.py [--seed N] [--verbose]

A generated corpus of scripted ``refund-desk`` runs (seeded, so every run of the
bench replays the same corpus), each advanced in this process against fresh SQLite
databases (the project's durable settings, DEBUG off) with a gate rule that allows
every call, so that the approvals are not what is measured. One exception, on
purpose: notes whose text holds "[review" wait for a reviewer (a second rule), whom
the bench plays at once (approve, or decline when the note says "decline"), so some
runs pause and resume in a new claim, as real runs do after every gated call.

- stuck runs of four kinds, each script 16-30 turns long with a known onset:
  ``exact`` (the same turn again and again: a read, an empty search, an unknown
  order, a note, a refund or a ticket close repeated), ``reworded`` (the same calls,
  different text each turn), ``cycle`` (reads in a cycle of 2 to 5: A,B,A,B /
  A,B,C,A,B,C ...) and ``drift`` (``search_orders`` with ever-different queries that
  find nothing or only lists already found, interleaved with re-reads of orders
  already read);
- healthy runs of up to 40 steps that keep learning (other orders, the policy,
  searches that find new orders, notes with new text, a small refund, re-reading the
  order after the refund, the email, the ticket) with stretches of up to
  ``patience - 1`` steps that learn nothing (re-reads, empty searches, a call the
  stage does not allow yet); a quarter walk the edge (patience - 1 steps without
  progress between single steps that do), and two read something new in the same
  turn as a note the reviewer declines (progress: the turn learned something).

The onset of a stuck run is the last step that made progress: after it the run
learns nothing new (no result not seen before, no new effect, no new stage). The
guard stops a run before the model call of the step that would come next; "onset ->
stop" is that step's number minus the onset, so a detector that stops a run after
exactly ``patience`` steps without progress scores ``patience + 1``.

Every script is checked against a model of the semantics before it runs: each step is
classified as progress, no progress, or ambiguous (progress under one reasonable
reading and not under another: results compared as a whole per tool, or as the facts
they reveal: an order exists, what was refunded on it, the policy); onsets and healthy
stretches only use unambiguous steps. After the run, the engine's own verdict per step
(``Step.progress``) is compared with the model's, and every disagreement is listed.

Targets (issue 9): 100% of stuck runs caught within patience + 1 steps of their
onset, at most 2% false positives on healthy runs. The exit status is 1 if one is
missed, 2 if the corpus itself is wrong (a healthy run that did not finish, a call
result the model did not expect).
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import setup_django

SEED = 9
STUCK_KINDS = ("exact", "reworded", "cycle", "drift")
PER_KIND = 12
HEALTHY = 30
MAX_FALSE_POSITIVE_RATE = 0.02
PROGRESS, STALL, AMBIGUOUS = "progress", "stall", "ambiguous"
# Notes whose text holds REVIEW wait for a reviewer (a gate rule of the bench's), who
# declines those that also hold DECLINE and approves the others: runs pause and resume.
REVIEW, DECLINE = "[review", "decline"
MARK = {PROGRESS: "P", STALL: ".", AMBIGUOUS: "?"}


# =============================================================================
# The world as the scripts see it, and a model of what a step teaches the run.
# =============================================================================
@dataclass(frozen=True)
class Order:
    order_id: str
    item: str
    amount: float
    customer: str
    email: str
    ticket: str

    @property
    def first_name(self) -> str:
        return self.customer.split()[0]


def load_world() -> dict[str, Order]:
    from tools.refund_desk.agent import WORLD

    return {
        order_id: Order(order_id, item, float(amount), name, email, ticket)
        for order_id, item, amount, name, email, ticket in WORLD
    }


def matches(world: dict[str, Order], query: str) -> tuple[str, ...]:
    """What ``search_orders`` finds: customer name, email or item contains the query
    (case-insensitive), by order id."""
    q = query.lower()
    return tuple(
        sorted(
            o.order_id
            for o in world.values()
            if q in o.customer.lower() or q in o.email.lower() or q in o.item.lower()
        )
    )


STAGE_TOOLS = {
    "investigating": {"add_note"},
    "acting": {"refund_item", "add_note"},
    "notifying": {"send_email", "add_note"},
    "closing": {"close_ticket", "add_note"},
}
READS = {"get_order", "get_policy", "search_orders"}
# Transitions: (source, target, tools that must have a committed call).
TRANSITIONS = (
    ("investigating", "acting", ("get_order", "get_policy")),
    ("acting", "notifying", ("refund_item",)),
    ("notifying", "closing", ("send_email",)),
)


class Model:
    """What the run has learned, under two readings of "a result not seen before":

    - whole: a tool's result compared as a whole (the same result of the same tool);
    - facts: what a result reveals, whichever tool revealed it: that an order exists
      (a search, get_order), what was refunded on it (get_order), the policy.

    A step is progress if a call is new under both readings (or commits a new write,
    or the stage changes), no progress if under neither, otherwise ambiguous.
    Errors and empty results are never progress; a repeated write is not a new effect.
    """

    def __init__(self, world: dict[str, Order]) -> None:
        self.world = world
        self.stage = "investigating"
        self.refunded = dict.fromkeys(world, 0.0)  # by this run
        self.seen_whole: set = set()
        self.seen_facts: set = set()
        self.committed: set[str] = set()
        self.writes: set = set()
        self.read_orders: set[str] = set()  # read with get_order

    def copy(self) -> Model:
        other = copy.copy(self)  # the world is shared; what the run learned is not
        other.refunded = dict(self.refunded)
        for name in ("seen_whole", "seen_facts", "committed", "writes", "read_orders"):
            setattr(other, name, set(getattr(self, name)))
        return other

    def step(self, calls: list[dict]) -> tuple[str, list[bool]]:
        """Apply a step's calls; its class and, per call, whether it errs."""
        stage = self.stage  # what the step may do is decided by the stage it started in
        verdicts, errors = [], []
        for call in calls:
            verdict, is_error = self._call(stage, call["name"], call.get("input", {}))
            verdicts.append(verdict)
            errors.append(is_error)
        self._advance_stage()
        if self.stage != stage or PROGRESS in verdicts:
            return PROGRESS, errors
        if AMBIGUOUS in verdicts:
            return AMBIGUOUS, errors
        return STALL, errors

    def _advance_stage(self) -> None:
        moved = True
        while moved:
            moved = False
            for source, target, after in TRANSITIONS:
                if self.stage == source and all(t in self.committed for t in after):
                    self.stage, moved = target, True

    def _learn(self, whole, facts: set) -> str:
        new_whole = whole not in self.seen_whole
        new_facts = bool(facts - self.seen_facts)
        self.seen_whole.add(whole)
        self.seen_facts |= facts
        if new_whole and new_facts:
            return PROGRESS
        return AMBIGUOUS if new_whole or new_facts else STALL

    def _call(self, stage: str, name: str, args: dict) -> tuple[str, bool]:
        if name not in READS and name not in STAGE_TOOLS[stage]:
            return STALL, True  # not allowed in this stage: an error result
        if name == "get_order":
            oid = args["order_id"]
            if oid not in self.world:
                return STALL, True
            self.committed.add(name)
            self.read_orders.add(oid)
            refunded = self.refunded[oid]
            facts = {("order", oid), ("refunded", oid, refunded)}
            return self._learn(("get_order", oid, refunded), facts), False
        if name == "get_policy":
            self.committed.add(name)
            return self._learn(("get_policy",), {("policy",)}), False
        if name == "search_orders":
            found = matches(self.world, args["query"])
            if not found:
                return STALL, False  # an empty result teaches nothing
            # A search shows the orders, not what was refunded on them.
            return self._learn(("search_orders", found), {("order", oid) for oid in found}), False
        if name == "add_note" and declined(args):
            return STALL, True  # "Declined by ...": an error result, no effect
        key = (name, tuple(sorted(args.items())))
        if key in self.writes:
            return STALL, False  # the earlier result, not a new effect
        oid = args.get("order_id")
        if oid is not None and oid not in self.world:
            return STALL, True
        if name == "refund_item":
            self.refunded[oid] += args["amount"]
        self.writes.add(key)
        self.committed.add(name)
        return PROGRESS, False


@dataclass
class Script:
    kind: str  # a stuck kind, or "healthy"
    variant: str
    task: str
    turns: list[dict]
    classes: list[str]  # the model's class of each step (the final reply: "final")
    errors: list[list[bool]]  # per step, per call: an error result expected
    onset: int | None = None  # stuck runs: the last step that made progress
    refunds: list[tuple[str, float]] = field(default_factory=list)

    @property
    def stuck(self) -> bool:
        return self.kind != "healthy"


# =============================================================================
# The corpus.
# =============================================================================
EMPTY_QUERIES = (
    "Babbage",
    "Turing",
    "Hamilton",
    "Knuth",
    "Dijkstra",
    "Liskov",
    "Ritchie",
    "Kernighan",
    "Hoare",
    "Wirth",
    "Backus",
    "Goldberg",
    "Thompson",
    "Engelbart",
    "Shannon",
    "kettle",
    "monitor",
    "headphones",
    "desk lamp",
    "umbrella",
    "bicycle",
    "yellow scarf",
    "charger",
    "backpack",
    "broken mug",
    "wrong size",
    "late delivery",
    "gift card",
    "blue sweater",
    "phone case",
    "refund request",
    "damaged parcel",
    "tracking",
    "invoice",
    "warranty",
)
NOTE_TOPICS = (
    "Customer reports the item arrived damaged",
    "Photo of the damage attached to the ticket",
    "Courier confirms a rough handling incident",
    "Order is within the 30-day refund window",
    "Customer prefers a refund over a replacement",
    "Checked the warehouse dispatch log",
    "No earlier complaints from this customer",
    "Packaging was the thin kind; flag to logistics",
    "Policy allows a partial refund here",
    "Asked the customer to keep the item for now",
    "Refund amount agreed with the customer",
    "Follow up in a week if the customer writes again",
    "Same batch as two other reported breakages",
    "Customer was polite and patient",
    "Linked this ticket to the logistics review",
)
OPENERS = (
    "Let me",
    "I will",
    "Next I should",
    "To be sure, I'll",
    "Once more, I want to",
    "Before deciding I need to",
    "It makes sense to",
    "Perhaps I should",
    "Now I'll",
    "I think I need to",
    "Just to double-check, I'll",
    "Again, let me",
)
CLOSERS = (
    "",
    " to be certain.",
    " in case something changed.",
    " before I act.",
    " one more time.",
    " so nothing is missed.",
    " to confirm the details.",
    " and then decide.",
)


class Corpus:
    """Builds the scripts. Every choice comes from one seeded random generator."""

    def __init__(self, world: dict[str, Order], rng, patience: int) -> None:
        self.world = world
        self.rng = rng
        self.patience = patience
        self.orders = sorted(world)
        # Refunds already planned per order, so no refund is refused for exceeding it.
        self.planned_refunds = dict.fromkeys(world, 0.0)
        self.aliases = self._aliases()
        self.empty = [q for q in EMPTY_QUERIES if not matches(world, q)]
        self.notes = 0

    def _aliases(self) -> dict[tuple[str, ...], list[str]]:
        """Queries by what they find: substrings (4 characters or more) of the fields."""
        out: dict[tuple[str, ...], set[str]] = defaultdict(set)
        for o in self.world.values():
            for text in (o.customer, o.email, o.item):
                for word in [text, *text.replace("@", " ").replace(".", " ").split()]:
                    for i in range(len(word)):
                        for j in range(i + 4, min(len(word), i + 12) + 1):
                            q = word[i:j].strip()
                            if len(q) >= 4:
                                out[matches(self.world, q)].add(q)
        return {found: sorted(qs) for found, qs in out.items() if found}

    # --- building blocks -------------------------------------------------------
    def task(self, oid: str) -> str:
        o = self.world[oid]
        return self.rng.choice(
            (
                f"Customer {o.customer} (ticket {o.ticket}) writes: my order {oid} arrived broken. "
                "Please refund it.",
                f"Ticket {o.ticket} from {o.email}: order {oid} ({o.item}) is damaged, "
                "they ask for their money back.",
                f"{o.first_name} says the {o.item.lower()} from order {oid} broke on arrival; "
                f"see ticket {o.ticket}.",
            )
        )

    def note(self, oid: str, review: str = "") -> dict:
        """A new note; ``review``: "approve" or "decline" makes it wait for a reviewer
        (the bench's rule), who then approves or declines it (the run resumes)."""
        self.notes += 1
        topic = NOTE_TOPICS[self.notes % len(NOTE_TOPICS)]
        marker = {"": "", "approve": f"{REVIEW} ", "decline": f"{REVIEW}, {DECLINE}] "}[review]
        return call("add_note", order_id=oid, text=f"{marker}{topic} (note {self.notes}).")

    def refund(self, oid: str) -> dict:
        cap = self.world[oid].amount - self.planned_refunds[oid]
        choices = [a for a in (5, 7.5, 10, 12, 20, 25, 40, 75, 99.5, 120, 199.99, 250, 480, 500) if a <= cap]
        if self.world[oid].amount <= 500:
            choices = [a for a in choices if a <= 12]  # a small order: leave room for others
        amount = self.rng.choice(choices)
        self.planned_refunds[oid] += amount
        reason = self.rng.choice(("Item arrived broken", "Damaged in transit", "Goodwill, partial refund"))
        return call("refund_item", order_id=oid, amount=amount, reason=reason)

    def email(self, oid: str) -> dict:
        o = self.world[oid]
        return call(
            "send_email",
            to=o.email,
            subject=f"Your refund for order {oid}",
            body=f"Hello {o.first_name}, we have refunded your order {oid}. "
            f"Sorry about the {o.item.lower()}.",
        )

    def close(self, oid: str) -> dict:
        return call("close_ticket", ticket_id=self.world[oid].ticket)

    def text(self, what: str, i: int) -> str:
        """A different wording for turn i: opener x closer, then a counter."""
        opener = OPENERS[i % len(OPENERS)]
        closer = CLOSERS[(i // len(OPENERS) + i) % len(CLOSERS)]
        extra = f" (attempt {i + 1})" if i >= len(OPENERS) * len(CLOSERS) else ""
        return f"{opener} {what}{closer or '.'}{extra}"

    def progress_turn(
        self, model: Model, oid: str, *, allow_writes: bool = True, review: str = "", decline: bool = False
    ) -> dict:
        """A turn that is progress under every reading (a note always is). ``review``:
        how its note, if it writes one, is decided. ``decline``: a read that learns
        something goes with a note the reviewer declines (still progress)."""
        options = []
        if oid not in model.read_orders:
            options.append(("Looking up the order.", [call("get_order", order_id=oid)]))
        if "get_policy" not in model.committed:
            options.append(("Checking the refund policy.", [call("get_policy")]))
        for other in self.orders:
            if other not in model.read_orders:
                options.append((f"Looking up {other} for comparison.", [call("get_order", order_id=other)]))
        for found, queries in self.aliases.items():
            # Not the task's own order before it was read: reading it would then be
            # new as a result but not as an order (ambiguous).
            if oid in found and oid not in model.read_orders:
                continue
            options.append(("Searching for related orders.", [search(self.rng.choice(queries))]))
        self.rng.shuffle(options)
        for text, calls in options:
            if model.copy().step(calls)[0] == PROGRESS:
                if decline:
                    calls = [*calls, self.note(oid, "decline")]
                    text += " And noting it for the record."
                return {"text": text, "tool_calls": calls}
        if not allow_writes or decline:
            raise AssertionError("no read left that makes progress")
        return {"text": "Writing down what I found.", "tool_calls": [self.note(oid, review)]}

    def stall_turn(self, model: Model, oid: str) -> dict:
        """A turn that is not progress: a re-read, an empty search, a call too early."""
        options = [
            (f"Searching for '{q}'.", [call("search_orders", query=q)])
            for q in self.rng.sample(self.empty, 3)
        ]
        for seen in sorted(model.read_orders):
            options.append((f"Re-reading {seen}.", [call("get_order", order_id=seen)]))
        if "get_policy" in model.committed:
            options.append(("Re-reading the policy.", [call("get_policy")]))
        if model.stage == "investigating":
            options.append(("Closing the ticket.", [self.close(oid)]))
        if model.stage in ("investigating", "acting"):
            options.append(("Telling the customer.", [self.email(oid)]))
        if model.stage == "closing":
            options.append(
                (
                    "Trying one more goodwill refund.",
                    [call("refund_item", order_id=oid, amount=1, reason="Goodwill")],
                )
            )
        self.rng.shuffle(options)
        for text, calls in options:
            if model.copy().step(calls)[0] == STALL:
                return {"text": text, "tool_calls": calls}
        raise AssertionError("no stall turn available")

    # --- healthy runs ------------------------------------------------------------
    def healthy(self, index: int) -> Script:
        rng = self.rng
        oid = self.orders[index % len(self.orders)]
        length = 40 if index % 5 == 0 else rng.randint(8, 40)  # turns, the final reply included
        # The longest stretch without progress, and how eagerly the run stalls: with 1.0
        # it walks the edge, patience - 1 steps without progress between single steps
        # that learn something (each of them keeps the run alive on its own).
        cap = self.patience - 1 if index % 3 != 2 else self.patience - 2
        p_stall = (0.15, 0.35, 0.6, 1.0)[index % 4]
        # Some runs pause on notes a reviewer approves, and some read something new in
        # the same turn as a note the reviewer declines (still progress), then resume.
        review = "approve" if index % 5 in (1, 3) else ""
        declines = 2 if index % 12 in (7, 11) else 0
        model = Model(self.world)
        todo = ["order", "policy", "refund", "reread", "email", "close"]
        turns: list[dict] = []
        stalled = 0
        while len(turns) < length - 1:
            remaining = length - 1 - len(turns)
            stall = stalled < cap and remaining > len(todo) and rng.random() < p_stall
            if stall:
                turn = self.stall_turn(model, oid)
            elif declines and remaining > len(todo) and self._can_learn(model, oid):
                turn = self.progress_turn(model, oid, decline=True)
                declines -= 1
            elif todo and (remaining <= len(todo) or rng.random() < 1.6 * len(todo) / remaining):
                turn = self._next_task_turn(model, oid, todo)
            else:
                turn = self.progress_turn(model, oid, review=review)
            if not stall and rng.random() < 0.2:
                # A progress step that also re-reads something: still progress.
                extra = self.stall_turn(model, oid)["tool_calls"]
                if model.copy().step(turn["tool_calls"] + extra)[0] == PROGRESS:
                    turn = {**turn, "tool_calls": turn["tool_calls"] + extra}
            turns.append(turn)
            stalled = 0 if model.copy().step(turn["tool_calls"])[0] == PROGRESS else stalled + 1
            model.step(turn["tool_calls"])
        assert not todo, (index, todo)
        turns.append({"text": f"Refunded part of {oid}, emailed the customer and closed the ticket."})
        variant = f"len{length}-cap{cap}-p{p_stall:g}"
        variant += "-reviewed" if review else ""
        variant += (
            "-declined" if any(declined(c["input"]) for t in turns for c in t.get("tool_calls", [])) else ""
        )
        script = self._checked("healthy", variant, self.task(oid), turns)
        longest = max_stall_run(script.classes)
        assert longest < self.patience, (index, script.classes)
        assert script.classes[-1] == "final"
        return script

    def _can_learn(self, model: Model, oid: str) -> bool:
        """Whether a read that makes progress is left (without drawing from the rng)."""
        reads = [call("get_order", order_id=o) for o in self.orders] + [call("get_policy")]
        reads += [
            search(qs[0])
            for found, qs in self.aliases.items()
            if oid not in found or oid in model.read_orders
        ]
        return any(model.copy().step([r])[0] == PROGRESS for r in reads)

    def _next_task_turn(self, model: Model, oid: str, todo: list[str]) -> dict:
        head = todo[0]
        fresh = oid not in model.read_orders and "get_policy" not in model.committed
        if head == "order" and todo[1] == "policy" and fresh and self.rng.random() < 0.3:
            todo[:2] = []
            return {
                "text": "Reading the order and the policy.",
                "tool_calls": [call("get_order", order_id=oid), call("get_policy")],
            }
        if head == "order" and oid in model.read_orders:
            todo.pop(0)
            return self.progress_turn(model, oid)
        if head == "policy" and "get_policy" in model.committed:
            todo.pop(0)
            return self.progress_turn(model, oid)
        todo.pop(0)
        if head == "order":
            return {"text": "Looking up the order.", "tool_calls": [call("get_order", order_id=oid)]}
        if head == "policy":
            return {"text": "Checking the refund policy.", "tool_calls": [call("get_policy")]}
        if head == "refund":
            return {"text": "Within policy: refunding part of it.", "tool_calls": [self.refund(oid)]}
        if head == "reread":
            # The refund changed the order: reading it again is learning something.
            return {
                "text": "Checking the refund shows on the order.",
                "tool_calls": [call("get_order", order_id=oid)],
            }
        if head == "email":
            return {"text": "Letting the customer know.", "tool_calls": [self.email(oid)]}
        return {"text": "Closing the ticket.", "tool_calls": [self.close(oid)]}

    # --- stuck runs --------------------------------------------------------------
    def prefix(self, oid: str, n: int, *, writes: bool = True) -> tuple[Model, list[dict]]:
        """n turns that each make progress."""
        model = Model(self.world)
        turns = []
        for _ in range(n):
            turn = self.progress_turn(model, oid, allow_writes=writes)
            model.step(turn["tool_calls"])
            turns.append(turn)
        return model, turns

    def exact(self, index: int) -> Script:
        rng = self.rng
        oid = self.orders[index % len(self.orders)]
        length = rng.randint(16, 30)
        variant = (
            "get_order",
            "get_policy",
            "search",
            "empty-search",
            "note",
            "order+policy",
            "close-ticket",
            "refund",
            "unknown-order",
            "get_order",
            "search",
            "note-reviewed",
        )[index % 12]
        _, turns = self.prefix(oid, rng.randint(0, 4) if variant not in ("close-ticket", "refund") else 0)
        if variant == "get_order":
            turn = {"text": "Looking up the order again.", "tool_calls": [call("get_order", order_id=oid)]}
        elif variant == "get_policy":
            turn = {"text": "Checking the policy.", "tool_calls": [call("get_policy")]}
        elif variant == "search":
            q = self.world[oid].first_name
            turn = {"text": f"Searching for {q}.", "tool_calls": [call("search_orders", query=q)]}
        elif variant == "empty-search":
            q = rng.choice(self.empty)
            turn = {"text": f"Searching for {q}.", "tool_calls": [call("search_orders", query=q)]}
        elif variant in ("note", "note-reviewed"):
            # Reviewed: the first note waits for a reviewer, the run resumes, then repeats it.
            review = "approve" if variant == "note-reviewed" else ""
            turn = {"text": "Noting the damage.", "tool_calls": [self.note(oid, review)]}
        elif variant == "order+policy":
            turn = {
                "text": "Reading the order and the policy.",
                "tool_calls": [call("get_order", order_id=oid), call("get_policy")],
            }
        elif variant == "unknown-order":
            bad = f"A-{1090 + index:04d}"
            turn = {"text": f"Looking up {bad}.", "tool_calls": [call("get_order", order_id=bad)]}
        else:
            # Work done properly up to the write that then repeats forever.
            turns = [
                {"text": "Looking up the order.", "tool_calls": [call("get_order", order_id=oid)]},
                {"text": "Checking the refund policy.", "tool_calls": [call("get_policy")]},
            ]
            refund = self.refund(oid)
            if variant == "refund":
                turn = {"text": "Refunding.", "tool_calls": [refund]}
            else:
                turns += [
                    {"text": "Refunding.", "tool_calls": [refund]},
                    {"text": "Letting the customer know.", "tool_calls": [self.email(oid)]},
                ]
                turn = {"text": "Closing the ticket.", "tool_calls": [self.close(oid)]}
        while len(turns) < length:
            turns.append(copy.deepcopy(turn))
        return self._stuck_script("exact", variant, oid, turns)

    def reworded(self, index: int) -> Script:
        rng = self.rng
        oid = self.orders[index % len(self.orders)]
        length = rng.randint(16, 30)
        variant = ("get_order", "order+policy", "search", "note", "policy", "swap-order")[index % 6]
        if index == 9:
            variant = "note-reviewed"
        _, turns = self.prefix(oid, rng.randint(1, 5))
        other = rng.choice([o for o in self.orders if o != oid])
        if variant == "get_order":
            calls, what = [call("get_order", order_id=oid)], f"look up order {oid}"
        elif variant == "order+policy":
            calls = [call("get_order", order_id=oid), call("get_policy")]
            what = "read the order and the policy"
        elif variant == "search":
            q = self.world[other].customer
            calls, what = [call("search_orders", query=q)], f"search for {q}"
        elif variant in ("note", "note-reviewed"):
            review = "approve" if variant == "note-reviewed" else ""
            calls, what = [self.note(oid, review)], "note what the customer reported"
        elif variant == "policy":
            calls, what = [call("get_policy")], "check what the refund policy says"
        else:
            calls = [call("get_order", order_id=oid), call("get_order", order_id=other)]
            what = "compare the orders"
        start = len(turns)
        while len(turns) < length:
            i = len(turns) - start
            ordered = calls[::-1] if variant == "swap-order" and i % 2 else calls
            turns.append({"text": self.text(what, i), "tool_calls": copy.deepcopy(ordered)})
        return self._stuck_script("reworded", variant, oid, turns)

    def cycle(self, index: int) -> Script:
        rng = self.rng
        oid = self.orders[index % len(self.orders)]
        length = rng.randint(16, 30)
        period = (2, 3, 4, 5, 2, 3)[index % 6]
        varied = index % 4 == 3  # the same calls in a cycle, worded differently each time
        while True:
            model, turns = self.prefix(oid, rng.randint(0, 3), writes=False)
            pool = [call("get_order", order_id=o) for o in self.orders] + [call("get_policy")]
            pool += [call("search_orders", query=rng.choice(qs)) for qs in self.aliases.values()]
            items = rng.sample(pool, period)
            trial = model.copy()
            classes = [trial.step([item])[0] for item in items]
            # The first pass may teach something; it must not be ambiguous, and the
            # second pass must teach nothing.
            if AMBIGUOUS not in classes and all(trial.step([item])[0] == STALL for item in items):
                break
        start = len(turns)
        while len(turns) < length:
            i = len(turns) - start
            item = items[i % period]
            what = describe(item)
            text = self.text(what, i) if varied else f"{what[0].upper()}{what[1:]}."
            turns.append({"text": text, "tool_calls": [copy.deepcopy(item)]})
        return self._stuck_script("cycle", f"period{period}" + ("-reworded" if varied else ""), oid, turns)

    def drift(self, index: int) -> Script:
        rng = self.rng
        oid = self.orders[index % len(self.orders)]
        length = rng.randint(16, 30)
        variant = ("empty", "refind", "refind+reread", "mixed")[index % 4]
        model = Model(self.world)
        turns = [{"text": "Looking up the order.", "tool_calls": [call("get_order", order_id=oid)]}]
        if index % 3:
            turns.append({"text": "Checking the refund policy.", "tool_calls": [call("get_policy")]})
        for turn in turns:
            model.step(turn["tool_calls"])
        # A search or two that find orders nobody read yet: progress, and lists to re-find.
        found_lists = []
        for found, queries in sorted(self.aliases.items()):
            if oid not in found and len(found_lists) < 1 + index % 2:
                q = rng.choice(queries)
                turn = {"text": f"Searching for other orders: '{q}'.", "tool_calls": [search(q)]}
                if model.copy().step(turn["tool_calls"])[0] == PROGRESS:
                    model.step(turn["tool_calls"])
                    turns.append(turn)
                    found_lists.append(found)
        used: set[str] = set()
        empty = self.rng.sample(self.empty, len(self.empty))
        start = len(turns)
        while len(turns) < length:
            i = len(turns)
            kind = {
                "empty": "empty",
                "refind": rng.choice(("empty", "refind")),
                "refind+reread": rng.choice(("refind", "refind", "reread")),
                "mixed": rng.choice(("empty", "refind", "reread")),
            }[variant]
            if kind == "reread":
                turn = {
                    "text": f"Maybe I missed something in {oid}; reading it again.",
                    "tool_calls": [call("get_order", order_id=oid)],
                }
            else:
                if kind == "refind":
                    found = rng.choice(found_lists)
                    q = rng.choice([q for q in self.aliases[found] if q.lower() not in used])
                else:
                    fresh = [q for q in empty if q.lower() not in used]
                    q = fresh[0] if fresh else f"order for case {i}"
                used.add(q.lower())
                text = rng.choice(
                    (
                        f"Perhaps the customer used another name; searching for '{q}'.",
                        f"Trying '{q}'.",
                        f"Let me search for '{q}' instead.",
                        f"Could it be under '{q}'?",
                    )
                )
                turn = {"text": text, "tool_calls": [call("search_orders", query=q)]}
            if variant == "mixed" and i == start + 1:
                # The reviewer declines a note in the middle of the drift: no progress,
                # and the run resumes in a new claim, its stalled steps carried over.
                turn = {**turn, "tool_calls": [*turn["tool_calls"], self.note(oid, "decline")]}
            turns.append(turn)
        return self._stuck_script("drift", variant, oid, turns)

    def build(self, kind: str, index: int) -> Script:
        """A script of the kind, drawn again while a step that matters would be
        ambiguous (progress under one reading and not the other)."""
        for _ in range(200):
            try:
                return getattr(self, kind)(index)
            except AssertionError:
                continue
        raise AssertionError(f"could not build a {kind} script #{index}")

    # --- checks ----------------------------------------------------------------
    def _checked(self, kind: str, variant: str, task: str, turns: list[dict]) -> Script:
        model = Model(self.world)
        classes, errors = [], []
        for turn in turns:
            if turn.get("tool_calls"):
                cls, errs = model.step(turn["tool_calls"])
            else:
                cls, errs = "final", []
            classes.append(cls)
            errors.append(errs)
        refunds = [
            (c["input"]["order_id"], c["input"]["amount"])
            for turn in turns
            for c in turn.get("tool_calls", [])
            if c["name"] == "refund_item"
        ]
        return Script(kind, variant, task, turns, classes, errors, refunds=refunds)

    def _stuck_script(self, kind: str, variant: str, oid: str, turns: list[dict]) -> Script:
        assert 16 <= len(turns) <= 30, len(turns)
        turns.append({"text": "I could not get any further with this."})
        script = self._checked(kind, variant, self.task(oid), turns)
        progress = [i for i, c in enumerate(script.classes) if c == PROGRESS]
        onset = progress[-1] if progress else -1  # -1: nothing learned at all
        assert AMBIGUOUS not in script.classes, (kind, variant, script.classes)
        assert max_stall_run(script.classes[: onset + 1]) < self.patience, (kind, variant, script.classes)
        assert len(turns) - 1 - (onset + 1) >= 3 * self.patience, (kind, variant, onset, len(turns))
        script.onset = onset
        return script


def declined(args: dict) -> bool:
    text = str(args.get("text", ""))
    return REVIEW in text and DECLINE in text


def call(name: str, **args) -> dict:
    return {"name": name, "input": args}


def search(query: str) -> dict:
    return call("search_orders", query=query)


def describe(item: dict) -> str:
    args = item["input"]
    if item["name"] == "get_order":
        return f"look up order {args['order_id']}"
    if item["name"] == "get_policy":
        return "check the refund policy"
    return f"search the orders for '{args['query']}'"


def max_stall_run(classes: list[str]) -> int:
    longest = current = 0
    for cls in classes:
        if cls == "final":
            continue
        current = 0 if cls == PROGRESS else current + 1
        longest = max(longest, current)
    return longest


def build_corpus(world: dict[str, Order], seed: int, patience: int) -> list[Script]:
    import random

    rng = random.Random(seed)
    corpus = Corpus(world, rng, patience)
    scripts = [corpus.build(kind, i) for kind in STUCK_KINDS for i in range(PER_KIND)]
    scripts += [corpus.build("healthy", i) for i in range(HEALTHY)]
    rng.shuffle(scripts)  # the world is shared: interleave kinds, deterministically
    return scripts


# =============================================================================
# Running the corpus.
# =============================================================================
@dataclass
class RunResult:
    script: Script
    run_id: int
    status: str
    guard: str
    stopped_at: int | None  # the step a stuck request stopped the run before
    steps: int
    engine_progress: list[bool]
    actual_errors: dict[tuple[int, int], bool]
    stuck_requests: int
    error: str
    decisions: int  # notes a reviewer decided: the run paused and resumed as often

    @property
    def delay(self) -> int | None:
        if self.stopped_at is None or self.script.onset is None:
            return None
        return self.stopped_at - self.script.onset


def run_one(script: Script, reviewer) -> RunResult:
    """Run the script to its end or until a guard stops it; a note waiting for a
    reviewer is decided (approved, or declined if it says so) and the run resumed."""
    from approvals.decisions.decision import Decision
    from approvals.decisions.services import approval_decide
    from approvals.models import ApprovalRequest
    from runs.engine import run_advance_until_settled
    from runs.models import Run, Step, ToolCall
    from runs.services import run_create

    run = run_create(
        agent_name="refund-desk",
        task=script.task,
        script={"turns": script.turns},
        max_steps=60,
        max_tokens=2_000_000,
        enqueue=False,
    )
    decisions = 0
    for _ in range(100):
        run_advance_until_settled(run.pk, sleep=lambda seconds: None)
        run.refresh_from_db()
        waiting = ApprovalRequest.objects.filter(run=run, kind="call", status="pending").select_related(
            "tool_call"
        )
        if run.status != Run.Status.WAITING_APPROVAL or run.guard or not waiting:
            break
        for approval in waiting:
            decision = (
                Decision.decline("Not for the record.")
                if declined(approval.tool_call.input)
                else Decision.approve()
            )
            approval_decide(approval_id=approval.pk, reviewer=reviewer, decision=decision, enqueue=False)
            decisions += 1
    steps = list(Step.objects.live().filter(run=run).order_by("number").values_list("number", "progress"))
    errors = {
        (step, position): is_error
        for step, position, is_error in ToolCall.objects.live()
        .filter(run=run)
        .values_list("step", "position", "is_error")
    }
    requests = ApprovalRequest.objects.filter(run=run, kind="stuck").count()
    return RunResult(
        script=script,
        run_id=run.pk,
        status=run.status,
        guard=run.guard,
        stopped_at=run.step if run.guard == "stuck" else None,
        steps=len(steps),
        engine_progress=[p for _, p in steps],
        actual_errors=errors,
        stuck_requests=requests,
        error=run.error,
        decisions=decisions,
    )


def setup(db_dir: Path):
    import os

    os.environ["EMAIL_URL"] = "locmem://"
    setup_django(db_dir, debug=False)
    # The scratch database has no reviewers: "nobody may decide it" is expected.
    logging.getLogger("approvals.notify.notifications").setLevel(logging.ERROR)
    from approvals.models import GateRule

    # Nothing waits for a reviewer but the notes that ask for one: the bench measures
    # the progress guard, not approvals.
    GateRule.objects.create(name="bench: every call allowed", tool="*", effect="allow", priority=1000)
    GateRule.objects.create(
        name="bench: notes marked for review",
        tool="add_note",
        field="text",
        operator=GateRule.Operator.CONTAINS,
        value=REVIEW,
        effect="needs_approval",
        priority=2000,
    )
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_superuser("bench-reviewer", "reviewer@example.com", None)


def ended(o: RunResult) -> str:
    return o.status + (f"/{o.guard}" if o.guard else "")


def marks(classes: list[str]) -> str:
    return "".join(MARK.get(c, "") for c in classes)


def report(outcomes: list[RunResult], patience: int, times: dict, seed: int, verbose: bool) -> int:
    limit = patience + 1
    stuck = [o for o in outcomes if o.script.stuck]
    healthy = [o for o in outcomes if not o.script.stuck]
    total_steps = sum(o.steps for o in outcomes)
    print(
        f"Stuck detection, refund-desk (patience {patience}): {len(outcomes)} scripted runs "
        f"({len(stuck)} stuck, {len(healthy)} healthy), seed {seed}"
    )
    print(
        "onset = the last step that made progress; stop = the step the run was stopped before; "
        f"a detector that waits exactly {patience} steps stops at onset + {limit}"
    )
    print()
    print(f"{'kind':<10} {'runs':>4} {'caught':>7} {'rate':>6} {'onset->stop min/med/max':>24} {'<= P+1':>7}")
    problems = []
    for kind in STUCK_KINDS:
        rows = [o for o in stuck if o.script.kind == kind]
        caught = [o for o in rows if o.stopped_at is not None]
        delays = [o.delay for o in caught]
        within = [d for d in delays if d <= limit]
        spread = f"{min(delays)}/{statistics.median(delays):g}/{max(delays)}" if delays else "-"
        print(
            f"{kind:<10} {len(rows):>4} {len(caught):>7} {len(caught) / len(rows):>6.0%} "
            f"{spread:>24} {len(within):>4}/{len(rows):<2}"
        )
        for o in rows:
            if o.stopped_at is None or o.delay > limit:
                problems.append(o)
    all_delays = [o.delay for o in stuck if o.delay is not None]
    spread = f"{min(all_delays)}/{statistics.median(all_delays):g}/{max(all_delays)}" if all_delays else "-"
    within = sum(1 for d in all_delays if d <= limit)
    print(
        f"{'all stuck':<10} {len(stuck):>4} {len(all_delays):>7} {len(all_delays) / len(stuck):>6.0%} "
        f"{spread:>24} {within:>4}/{len(stuck):<2}"
    )
    onsets = [o.script.onset for o in stuck]
    lengths = [len(o.script.turns) for o in stuck]
    never = sum(1 for x in onsets if x < 0)
    print(
        f"  scripts of {min(lengths) - 1}-{max(lengths) - 1} turns and a final reply; onset at step "
        f"{max(min(onsets), 0)}-{max(onsets)} ({never} learn nothing at all: onset -1); steps run after "
        f"the onset {sum(o.steps - o.script.onset - 1 for o in stuck)} of "
        f"{sum(len(o.script.turns) - 1 - o.script.onset - 1 for o in stuck)} scripted"
    )
    early = [o for o in stuck if o.delay is not None and o.delay < limit]
    if early:
        print(f"  stopped before {patience} steps without progress: {len(early)} run(s)")

    fps = [o for o in healthy if o.guard == "stuck"]
    fp_rate = len(fps) / len(healthy)
    hsteps = [len(o.script.turns) for o in healthy]
    longest = [max_stall_run(o.script.classes) for o in healthy]
    print()
    print(
        f"healthy    {len(healthy):>4} runs of {min(hsteps)}-{max(hsteps)} scripted steps (median "
        f"{statistics.median(hsteps):g}), longest stretch without progress {max(longest)} "
        f"({sum(1 for x in longest if x == patience - 1)} runs reach {patience - 1})"
    )
    print(f"  false positives: {len(fps)} ({fp_rate:.1%})")
    endings = Counter(ended(o) for o in healthy)
    print("  ended: " + ", ".join(f"{k} {v}" for k, v in sorted(endings.items())))
    resumed = [o for o in outcomes if o.decisions]
    print(
        f"paused on a note for a reviewer and resumed: {len(resumed)} runs "
        f"({sum(1 for o in resumed if o.script.stuck)} stuck, "
        f"{sum(1 for o in resumed if not o.script.stuck)} healthy), {sum(o.decisions for o in resumed)} "
        "decisions"
    )

    # The engine's verdict per step against the model's.
    disagreements = []
    for o in outcomes:
        for number, engine in enumerate(o.engine_progress):
            expected = o.script.classes[number]
            if expected in (PROGRESS, STALL) and engine != (expected == PROGRESS):
                disagreements.append((o, number, expected, engine))
    corpus_errors = []
    for o in outcomes:
        for number, errs in enumerate(o.script.errors[: o.steps]):
            for position, expected in enumerate(errs):
                actual = o.actual_errors.get((number, position))
                if actual is not None and actual != expected:
                    corpus_errors.append((o, number, position, expected, actual))
        if not o.script.stuck and (o.status != "done" and o.guard != "stuck"):
            corpus_errors.append((o, None, None, "done", f"{o.status}/{o.guard}: {o.error}"))
        if o.guard == "stuck" and o.stuck_requests != 1:
            corpus_errors.append((o, None, None, "1 stuck request", f"{o.stuck_requests}"))
    print()
    print(f"engine vs model, progress per step: {len(disagreements)} disagreement(s) in {total_steps} steps")
    for o, number, expected, engine in disagreements[:12]:
        turn = o.script.turns[number]
        calls = ", ".join(f"{c['name']}({short(c['input'])})" for c in turn.get("tool_calls", []))
        print(
            f"  run {o.run_id} {o.script.kind}/{o.script.variant} step {number}: model {expected}, "
            f"engine {'progress' if engine else 'no progress'}: {calls}"
        )
    if corpus_errors:
        print(f"corpus: {len(corpus_errors)} unexpected result(s)")
        for o, number, position, expected, actual in corpus_errors[:12]:
            print(
                f"  run {o.run_id} {o.script.kind}/{o.script.variant} step {number} call {position}: "
                f"expected {expected}, got {actual}"
            )
    if problems or fps:
        print()
        print("runs that missed (model . = no progress, P = progress; engine the same per step):")
        for o in [*problems, *fps]:
            print(
                f"  run {o.run_id} {o.script.kind}/{o.script.variant}: onset {o.script.onset}, "
                f"stopped at {o.stopped_at}, ended {o.status}{'/' + o.guard if o.guard else ''}"
            )
            print(f"    model  {marks(o.script.classes)}")
            print(f"    engine {''.join('P' if p else '.' for p in o.engine_progress)}")
    if verbose:
        print()
        for o in outcomes:
            print(
                f"  run {o.run_id:>3} {o.script.kind:<8} {o.script.variant:<28} onset {o.script.onset!s:>4} "
                f"stop {o.stopped_at!s:>4} {ended(o):<24} {marks(o.script.classes)}"
            )

    caught_all = not problems
    fp_ok = fp_rate <= MAX_FALSE_POSITIVE_RATE
    print()
    print(
        f"target: 100% of stuck runs stopped within {limit} steps of onset: "
        f"{len(stuck) - len(problems)}/{len(stuck)} {'OK' if caught_all else 'MISSED'}"
    )
    print(
        f"target: at most {MAX_FALSE_POSITIVE_RATE:.0%} false positives: {fp_rate:.1%} "
        f"{'OK' if fp_ok else 'MISSED'}"
    )
    per_step = times["runs"] * 1000 / max(total_steps, 1)
    print(
        f"wall time: {times['total']:.1f} s (databases {times['setup']:.1f} s, "
        f"corpus {times['corpus']:.1f} s, runs {times['runs']:.1f} s: {total_steps} steps, "
        f"{per_step:.1f} ms/step)"
    )
    if not (caught_all and fp_ok):
        return 1
    return 2 if corpus_errors else 0


def short(args: dict) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return text if len(text) <= 60 else text[:57] + "..."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--verbose", action="store_true", help="one line per run")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stuck-") as tmp:
        reviewer = setup(Path(tmp))
        from tools.registry import get_agent

        patience = get_agent("refund-desk").patience
        times = {"setup": time.perf_counter() - started}
        scripts = build_corpus(load_world(), args.seed, patience)
        times["corpus"] = time.perf_counter() - started - times["setup"]
        outcomes = [run_one(script, reviewer) for script in scripts]
        times["runs"] = time.perf_counter() - started - times["setup"] - times["corpus"]
        from django.db import connections

        connections.close_all()
    times["total"] = time.perf_counter() - started
    status = report(outcomes, patience, times, args.seed, args.verbose)
    sys.exit(status)


if __name__ == "__main__":
    main()
