"""The decisions room: approval requests, proposals, votes, claims, guards, the queue
and the desk's views. Imports models, record and policy; never notify, which
calls it by name through ``decisions.announce`` (``DESK_ANNOUNCER``), as the loop calls the gate."""
