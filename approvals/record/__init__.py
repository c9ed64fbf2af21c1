"""The record room: what approvals' rows add to the record (``core`` holds the chain
itself), its verification and anchors, export and import of a run, and the receiver
that records a rule's versions. Of approvals, imports only models."""
