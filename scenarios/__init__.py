"""The shipped scenarios, installed as the package data `crashbench.scenarios` (see pyproject.toml).

This file makes the folder a regular package, so importlib.resources finds the scenarios in every
install, the editable one included (setuptools' editable finder maps only packages with an __init__).
"""
