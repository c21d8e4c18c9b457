"""Interactive views of relevance for JupyterLab (ipywidgets)."""
