"""Present: renderers that turn analysis results into text, HTML and dashboards; they compute nothing."""
