"""headroom on Ray Serve: models as Serve deployments (ingress -> DeploymentHandle -> a DataPlane per replica),
headroom's routing policies as Serve's request router, autoscaling from headroom's policy (docs/ray.md)."""
