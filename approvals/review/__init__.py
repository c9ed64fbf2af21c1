"""The review room: what a reviewer reads about an approval and who may decide it.
Its arguments and notes, the warnings (repeats, quotes of the run's notes), a guard's
question, the transcript, the groups and SLA of its rule, the queue's visibility and
the refusals. Read by notify and decisions; imports policy, record and the models."""
