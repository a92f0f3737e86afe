"""The labeling site's routes by concern: `signin`, `labeling` (a labeler's pages), `admin` (the
team and the review pages) and `exports` (downloads); `server.create_app` mounts them all."""
