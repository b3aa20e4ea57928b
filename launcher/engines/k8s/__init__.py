"""`tfl export k8s`: the same job and cluster roles as Kubernetes manifests (JobSet or TFJob).

pods.py (what every pod shares) · jobset.py / tfjob.py (one format each) · node/entry.py (the
stdlib-only shim that sets a JobSet pod's TF_CONFIG) · render.py (YAML) · export.py (checks,
then one of the formats).
"""
