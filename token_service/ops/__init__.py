"""The operators' tools: records found, shown, revoked, released (``admin``) and reconciled (``reconcile``).

They read what both the service and the SDK write (token records, the
Idempotency-Key middlewares' stored responses, the durable backstop's rows),
so they sit above core and the SDK and import both; ``server/`` serves them
as ``token-service admin`` and the ``/admin/`` routes (docs/operations.md).
"""
