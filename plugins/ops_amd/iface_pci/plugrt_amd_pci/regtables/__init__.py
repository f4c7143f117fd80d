"""Register tables of the AMD GPUs the driverless bring-up programs, as data: register offsets, field masks and
documented defaults, each table copied by hand from the Linux kernel source its comment names (the amdgpu driver's
register headers under drivers/gpu/drm/amd/include/asic_reg/ and the drivers under drivers/gpu/drm/amd/ that use
them; no script generates them). A module here holds nothing but its docstring and assignments of literal values
(plugins/ops_amd/iface_pci/tests/test_amd_regtables.py reads each with ast.literal_eval and checks that every table
names its source): what the tables mean, and the code that uses them, are in the bring-up modules.

- `gmc`: the memory hubs (MMHUB 3.0.0/4.1.0, the GFXHUBs of GC 11/12): plugrt_amd_pci.gmc, psp;
- `gc`: the graphics core's RLC, CP, compute-VMID and MEC-queue registers, golden settings: gfx, gc_init, mec, psp;
- `nbio`: the bus interface's index/data pair, HDP remap, doorbell routing, revision id: regs, hdp, doorbell, gc_init;
- `mp`: the SMU's mailbox: smu.

Nothing here has been checked against a GPU: only against the kernel sources named (and the fakes, which keep their
own copies of what they check).
"""
