"""Register tables of the AMD GPUs the driverless bring-up programs, as data: register offsets, field masks and
documented defaults, each table copied by hand from the Linux kernel source its comment names (the amdgpu driver's
register headers under drivers/gpu/drm/amd/include/asic_reg/ and the drivers under drivers/gpu/drm/amd/amdgpu/; no
script generates them). A module here holds nothing but its docstring and assignments of literal values (a test reads
each with ast.literal_eval): what the tables mean, and the code that uses them, are in the bring-up modules
(plugrt_amd_pci.gmc for regtables.gmc). Nothing here has been checked against a GPU.
"""
