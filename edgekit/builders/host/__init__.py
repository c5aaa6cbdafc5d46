"""The build's host: what a build will need against what this machine has, what it used, and
the debris of killed builds swept by the next."""
