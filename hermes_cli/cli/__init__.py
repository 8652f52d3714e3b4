"""The ``hermes`` command line: thin commands over the engine, the app, bench and evaluation.

``main.main`` is the console entry point; ``main.app`` the typer application.
"""
