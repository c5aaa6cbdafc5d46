"""The daemon's HTTP output: a bounded server no client can starve, its wire format, and the
``/metrics``, ``/healthz`` and ``/stats`` endpoint."""
