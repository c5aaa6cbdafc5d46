"""The daemon's configuration: the TOML file and the flags over it, its sections (cameras,
model, cascade stages, addresses) and the checks it must pass before the daemon starts."""
