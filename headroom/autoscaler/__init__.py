"""Autoscaling: a pure policy (`headroom.autoscaler.policy.decide`) and a controller driving an Actuator."""
