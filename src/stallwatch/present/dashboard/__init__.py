"""The live insights dashboard (`stallwatch dashboard`): a small ASGI server (Starlette on uvicorn) with one
offline page and a JSON API, both answering from `RunAnalysis`. Imported only by the command that serves it:
starlette and uvicorn are the `dashboard` extra."""
