"""Small infrastructure shared by the rest of the package: environment flags
(:mod:`.env`), atomic files (:mod:`.files`), dtypes (:mod:`.dtypes`), zero-copy views of
Paddle tensors (:mod:`.views`), float16 array conversion (:mod:`.fp16`), array helpers
(:mod:`.arrays`) and the check of the installed Paddle release (:mod:`.versions`)."""
