"""The on-device service: daemon (capture thread + inference loop), config, publishers, HTTP metrics."""
