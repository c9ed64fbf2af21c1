"""The decisions room: approval requests, proposals, votes, claims, guards, the queue
and the desk's views. Imports models, record and policy; never notify, which
hears of its events through ``decisions.signals``."""
