"""``GET /api/v1/runs/{id}/export``: the run as ``exportrun`` writes it, streamed.

Visible to whoever may see the run (its requester, ``runs.view_all_runs``); anyone
else gets 404, exactly like a run that does not exist.
"""

from __future__ import annotations

from django.http import StreamingHttpResponse
from ninja import Path, Router

from approvals.record.errors import ExportRefused
from approvals.record.export import CONTENT_TYPE, run_export_lines
from runs.selectors import run_get

from .errors import ApiError
from .schemas import MAX_ID, ErrorOut

router = Router(tags=["runs"])

# The 200 is a stream, not a schema: declared by hand.
EXPORT_OK = {
    200: {
        "description": (
            "JSON Lines: a header (type countersign-run, format, counts, chain heads), then one "
            '{"type", "data", "seal"} object per row. `manage.py importrun FILE` reads it.'
        ),
        "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
    },
}


@router.get(
    "/{run_id}/export",
    response={status: ErrorOut for status in (401, 404, 409, 422)},
    summary="Export a finished run as JSON Lines",
    description=(
        "The run, its whole transcript, steps, tool calls, approvals, proposals, votes and audit "
        "chain, each line sealed under the desk's integrity key (a desk with another key cannot "
        "import it). The sandbox world is not in it. 404 `not_found` for a run you may not see; "
        "409 `not_exportable` for a run that is not finished or does not verify."
    ),
    openapi_extra={"responses": EXPORT_OK},
)
def run_export(request, run_id: int = Path(..., ge=1, le=MAX_ID, description="The run's id.")):

    run = run_get(run_id, user=request.auth)
    if run is None:
        raise ApiError(404, "not_found", f"no run {run_id} that you may see")
    try:
        lines = run_export_lines(run)
    except ExportRefused as exc:
        raise ApiError(409, "not_exportable", str(exc)) from None
    response = StreamingHttpResponse(lines, content_type=CONTENT_TYPE)
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}.jsonl"'
    return response
