"""Small example environments that show how to plug your own Gymnasium env into Flywheel (module:EnvId)."""
