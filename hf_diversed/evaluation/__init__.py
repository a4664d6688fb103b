"""The evaluation harness around ``generate``: tasks and rewards, the code sandbox, the real models, the benchmark.

- ``tasks/``: the task registry (data, chat prompts, TRL-style rewards).
- ``sandbox.py``: runs model-generated code in a separate, resource-limited process.
- ``real_models.py``: the real benchmark models, obtained offline from PyPI.
- ``methods.py``: the decoding methods compared, one timed generation of each.
- ``bench/``: ``hf-diversed bench``.
- ``plotting.py``: quality-vs-speed plots of bench summaries.
- ``demo.py``: ``hf-diversed demo``.
- ``trim_draft.py``: ``hf-diversed trim-draft`` (a draft with a trimmed vocabulary, counted on a task's rows).

Uses :mod:`hf_diversed.generation` and :mod:`hf_diversed.modeling`; never imported by them.
"""
