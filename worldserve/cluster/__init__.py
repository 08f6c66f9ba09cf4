"""Scale-out on Ray Serve (`worldserve serve --cluster ray`, extra `worldserve[ray]`).

The only package (with the cli path under `--cluster ray`) that imports `ray`. Layout:
`ids.py` (owner tags, pure), `router.py` (the `OwnerRouter`), `replica.py` (a stage engine per
replica), `client.py` (`RayStageClient`, the api's stage client), `app.py` (deploy and run).
See docs/scale-out.md.
"""
