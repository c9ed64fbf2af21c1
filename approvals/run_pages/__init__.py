"""The run pages: the history, one run's timeline and status box, its checkpoints,
start, cancel, hand-over, repin and undo. Desk pages over runs, on the floor that may
know approvals (who decided a call, who may hand a run over)."""
