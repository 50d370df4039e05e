"""What the tests share, imported as ``support.<module>`` (pytest puts ``tests/`` on
``sys.path`` for its root conftest; the benchmarks and tools insert it themselves):

- :mod:`.helpers`: a fresh interpreter (``run_python``), fresh programs, scope and unique
  names (``fresh_programs``);
- :mod:`.models`: small Paddle programs built with their weights; :mod:`.serving_models`:
  saved models, a served model's reference answers, a server in its own process;
- :mod:`.runner` and :mod:`.cases`: the operator conformance cases and their runner
  (each op against Paddle's CPU kernel);
- :mod:`.ipu2x_base`: Paddle 2.x's IPU test idioms;
- :mod:`.zoo_models`, :mod:`.eco_models`: models built from paddle.vision and from the
  code of Paddle's own libraries.
"""
