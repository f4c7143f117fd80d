"""Register tables of the graphics core (GC 11 and GC 12) that the bring-up's RLC, CP, compute-VMID and MEC-queue
steps program (plugrt_amd_pci.gfx, gc_init, mec): dword offsets with the register segment they are in (an index into
the GC block's register bases from IP discovery), and the kernel's golden settings.

Data only (plugrt_amd_pci.regtables). Copied by hand from the Linux kernel's
drivers/gpu/drm/amd/include/asic_reg/gc/gc_11_0_0_offset.h and gc_12_0_0_offset.h (GC 12 has these registers at the
same places) and drivers/gpu/drm/amd/amdgpu/gfx_v11_0.c, gfx_v12_0.c, as each table's comment says.
"""

#: (dword offset, segment) of GRBM_GFX_CNTL and CP_MEC_RS64_CNTL (gc_11_0_0_offset.h, gc_12_0_0_offset.h)
GRBM_GFX_CNTL = (0x900, 1)
CP_MEC_RS64_CNTL = (0x2904, 1)
#: (dword offset, segment) of CP_STAT (gc_11_0_0_offset.h, gc_12_0_0_offset.h)
CP_STAT = (0xF40, 0)
#: GC version -> (dword offset, segment) of RLC_RLCS_BOOTLOAD_STATUS (gc_11_0_0_offset.h, gc_12_0_0_offset.h)
BOOTLOAD_STATUS = {(11, 0, 0): (0x4E82, 1), (11, 0, 2): (0x4E82, 1), (11, 0, 3): (0x4E82, 1), (12, 0, 0): (0x4E7C, 1), (12, 0, 1): (0x4E7C, 1)}
#: GC 11 (gc_11_0_0_offset.h) registers of the RS64 CP set-up: (dword offset, segment)
RS64_11 = {"PFP_START": (0x1E44, 0), "PFP_START_HI": (0x1E59, 0), "ME_START": (0x1E45, 0), "ME_START_HI": (0x1E79, 0),
           "MEC_START": (0x2900, 1), "MEC_START_HI": (0x2938, 1), "CP_ME_CNTL": (0x803, 1), "CP_MEC_RS64_CNTL": (0x2904, 1),
           "GRBM_GFX_CNTL": (0x900, 1)}
#: the HQD block hqd_load_v11 writes, CP_MQD_BASE_ADDR .. CP_HQD_PQ_WPTR_HI, GC segment 0 (gc_11_0_0_offset.h; the
#: same offsets in gc_12_0_0_offset.h)
HQD = {"CP_MQD_BASE_ADDR": 0x1FA9, "CP_MQD_BASE_ADDR_HI": 0x1FAA, "CP_HQD_ACTIVE": 0x1FAB, "CP_HQD_VMID": 0x1FAC,
       "CP_HQD_PERSISTENT_STATE": 0x1FAD, "CP_HQD_PIPE_PRIORITY": 0x1FAE, "CP_HQD_QUEUE_PRIORITY": 0x1FAF, "CP_HQD_QUANTUM": 0x1FB0,
       "CP_HQD_PQ_BASE": 0x1FB1, "CP_HQD_PQ_BASE_HI": 0x1FB2, "CP_HQD_PQ_RPTR": 0x1FB3, "CP_HQD_PQ_RPTR_REPORT_ADDR": 0x1FB4,
       "CP_HQD_PQ_RPTR_REPORT_ADDR_HI": 0x1FB5, "CP_HQD_PQ_WPTR_POLL_ADDR": 0x1FB6, "CP_HQD_PQ_WPTR_POLL_ADDR_HI": 0x1FB7,
       "CP_HQD_PQ_DOORBELL_CONTROL": 0x1FB8, "CP_HQD_PQ_CONTROL": 0x1FBA, "CP_HQD_IB_CONTROL": 0x1FBE, "CP_MQD_CONTROL": 0x1FCB,
       "CP_HQD_EOP_BASE_ADDR": 0x1FCE, "CP_HQD_EOP_BASE_ADDR_HI": 0x1FCF, "CP_HQD_EOP_CONTROL": 0x1FD0,
       "CP_HQD_AQL_CONTROL": 0x1FDE, "CP_HQD_PQ_WPTR_LO": 0x1FDF, "CP_HQD_PQ_WPTR_HI": 0x1FE0}
#: the registers hqd_load_v11 writes again after the block, and the MEC's doorbell range, GC segment 0
#: (gc_11_0_0_offset.h, gc_12_0_0_offset.h)
MEC_REGS = {"CP_HQD_ACTIVE": 0x1FAB, "CP_HQD_PQ_DOORBELL_CONTROL": 0x1FB8, "CP_HQD_EOP_RPTR": 0x1FD1,
            "CP_MEC_DOORBELL_RANGE_LOWER": 0x1DFC, "CP_MEC_DOORBELL_RANGE_UPPER": 0x1DFD}
#: the compute VMIDs' registers gfx_v11_0_init_compute_vmid writes: name -> (dword offset, segment) (gc_11_0_0_offset.h;
#: the SH_MEM and SPI_GDBG ones at the same places in gc_12_0_0_offset.h, which has no GDS registers)
COMPUTE_VMID_REGS = {"SH_MEM_BASES": (0x9E3, 1), "SH_MEM_CONFIG": (0x9E4, 1), "SPI_GDBG_PER_VMID_CNTL": (0x1F72, 0),
                     "GDS_VMID0_BASE": (0x20A0, 0), "GDS_VMID0_SIZE": (0x20A1, 0), "GDS_GWS_VMID0": (0x20C0, 0), "GDS_OA_VMID0": (0x20D0, 0)}
#: (dword offset, segment) of RLC_SRM_CNTL (gc_11_0_0_offset.h, gc_12_0_0_offset.h)
RLC_SRM_CNTL = (0x4C80, 1)
#: (register, segment, offset, and-mask, or-mask) per GC version (gfx_v11_0.c golden_settings_gc_11_0, gfx_v12_0.c
#: golden_settings_gc_12_0; offsets gc_11_0_0_offset.h / gc_12_0_0_offset.h)
GOLDEN_11 = (("TCP_CNTL", 1, 0x19A2, 0x20000000, 0x20000000),)
GOLDEN_12 = (("DB_MEM_CONFIG", 0, 0x13D2, 0xF, 0xF), ("CB_HW_CONTROL_1", 0, 0x1425, 0x03000000, 0x03000000),
             ("GL2C_CTRL5", 1, 0x2E19, 0x70, 0x20))
#: GC (major, minor) -> (dword offset, segment) of GCMC_VM_FB_OFFSET (gc_11_0_0/_11_0_3/_12_0_0_offset.h): VRAM's
#: physical base for the PSP's TMR
FB_OFFSET = {(11, 0): (0x15A7, 0), (11, 5): (0x15A7, 0), (12, 0): (0x15A7, 0)}
