"""The live dashboard: a small web server (Starlette on uvicorn, in its own process) that renders what the
analysis layer computes as JSON and one offline page (no CDN): Overview, Nodes, Ranks and Runs, updated
while the job runs through one shared follower per run."""
