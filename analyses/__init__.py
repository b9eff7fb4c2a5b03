"""Analyses of a workbench store. They read the store with xarray/zarr and never import torch or
nnsight, so a store copied off a GPU machine can be analysed anywhere."""
