"""The ground floor: what every room uses and no room owns. The record (``models``:
``AuditEvent`` and ``AuditChain``; ``chain``, ``facts``, ``triggers``), the hashes it
is made of (``hashing``), sealing at rest and its model fields (``sealing``,
``sealed``), money as text (``money``), locks (``locks``), raw SQL for hot rows
(``rawsql``) and the log context (``logs``). Nothing here imports a room above it."""
