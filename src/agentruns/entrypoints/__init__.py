"""Drivers: the composition root, the command line, the sandbox gateway's HTTP app and the demo.

They sit over the adapters, the use cases and the domain, and are the only modules that name
typer, rich, FastAPI, uvicorn or dependency-injector (ADR 0012).
"""
