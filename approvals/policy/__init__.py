"""The policy room: gate rules and their verdicts, aggregates, shadow rules,
standing approvals, the rule as it was decided. Of approvals, imports
models and record only."""
