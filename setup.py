"""Builds data_prep's compiled text-structure loops (Cython); everything else is in pyproject.toml."""
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize([Extension("data_prep._structure", ["data_prep/_structure.pyx"],
                                       extra_compile_args=["-O3"])], quiet=True))
