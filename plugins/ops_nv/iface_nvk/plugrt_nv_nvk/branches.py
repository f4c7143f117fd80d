"""The NVIDIA driver branches plugrt-nv-nvk knows the struct layouts of (plugrt_nv_nvk.rm): what the entry module's
probe and the layouts share, in a leaf of its own."""

#: driver branches with struct layouts in rm.py (580 is the one that has run; 570 and 610 come from the headers)
BRANCHES = {570: range(570, 580), 580: range(580, 610), 610: range(610, 620)}
