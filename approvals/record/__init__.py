"""The record room: the hash-chained audit trail, its verification and anchors,
export and import of a run, the receivers of the engine's signals. Of approvals,
imports only models and the ground ``record.chain``."""
