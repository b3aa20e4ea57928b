"""The Kubernetes export's node side: ``entry``, the shim shipped in the ConfigMap that each pod runs
(standard library only)."""
