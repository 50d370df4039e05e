"""Utilities every layer may use, built on the standard library and numpy only (no
Paddle, no other part of paddle_ipu but :mod:`paddle_ipu.errors`): environment flags
(:mod:`.env`), atomic files (:mod:`.files`), dtypes (:mod:`.dtypes`), array helpers
(:mod:`.arrays`), the job a launcher started (:mod:`.job`), the supported Paddle releases
(:mod:`.paddle_releases`, read by setup.py too) and the check of the installed one
(:mod:`.versions`)."""
