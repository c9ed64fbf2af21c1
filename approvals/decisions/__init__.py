"""The decisions room: approval requests, proposals, votes, claims, the SLA sweep
(reminders, escalations, expiries), the queue, the desk's views and Slack's
interactions. Reads review, policy and record; tells people through notify
(``notify.announce``), in the transaction of what it reports."""
