"""One router per resource of the gateway's HTTP API; ``flywheel.services.gateway.api.main`` joins them."""
