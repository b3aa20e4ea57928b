"""Engines: what runs a plan's tasks. ``base`` is the protocol, ``registry`` maps an engine's name to its class
(imported lazily); ``local`` is one file, ``ssh/``, ``slurm/``, ``ray/`` and ``k8s/`` one folder each, whole, with what
runs on their nodes in a stdlib-only ``node/`` subpackage. ``preflight`` judges the hosts' facts for every engine,
``teardown`` stops any kind of task, ``doctor`` is ``tfl doctor``.

This file imports nothing: a node imports ``launcher.engines.<engine>.node`` without loading the launcher."""
