"""The gateway's HTTP API: routers per resource (routes/), their dependencies (deps) and error answers (errors)."""
