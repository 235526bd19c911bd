"""The s4fs service layer: what runs s4fs as a systemd service on a training machine.

* :mod:`s4fs.service.runner` — ``s4fs runner``: entitlement, codec self-check, the
  health/metrics server, and the supervised mount.
* :mod:`s4fs.service.health` — ``/healthz`` checks and the HTTP server.
* :mod:`s4fs.service.entitlement` — AWS Marketplace ``RegisterUsage``, fail-closed.
* :mod:`s4fs.service.selfcheck` — the boot-time lossless round trip.
* :mod:`s4fs.service.supervisor` — starting, watching and unmounting the mount; sd_notify.

Nothing here is imported by ``import s4fs``; boto3 and prometheus_client are imported
only when used.
"""
