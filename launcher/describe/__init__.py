"""Describe: a cluster file into the description of its kind (``kinds``: which block, parsed how; ``spec``: a
``cluster`` block; ``fields``: one rule per kind of field; ``placement``: GPUs; ``hosts``: what each host needs).
Pure data and pydantic validation; nothing here starts, plans or reaches a host."""
