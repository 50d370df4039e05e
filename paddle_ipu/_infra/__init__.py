"""Small infrastructure shared by the rest of the package: environment flags
(:mod:`.env`), atomic files (:mod:`.files`), dtypes (:mod:`.dtypes`), zero-copy views of
Paddle tensors (:mod:`.views`), float16 array conversion (:mod:`.fp16`), array helpers
(:mod:`.arrays`), the supported Paddle releases (:mod:`.paddle_releases`, read by setup.py
too) and the check of the installed one (:mod:`.versions`)."""
