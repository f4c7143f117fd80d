"""Register tables of the NBIO (NBIF) block, the GPU's bus interface, that register access, the HDP flush, doorbell
routing and the revision id read (plugrt_amd_pci.regs, hdp, doorbell, gc_init): per NBIO (major, minor), where each
register is as (dword offset, segment), the segment an index into the block's register bases from IP discovery.

Data only (plugrt_amd_pci.regtables). Copied by hand from the Linux kernel's
drivers/gpu/drm/amd/include/asic_reg/nbio/nbio_4_3_0_offset.h, nbif_6_3_1_offset.h, _sh_mask.h and
drivers/gpu/drm/amd/amdgpu/nbio_v2_3.c, nbio_v4_3.c, nbio_v6_1.c, nbio_v7_0.c, nbio_v7_4.c, nbif_v6_3_1.c, as each
table's comment says.
"""

#: NBIO (major, minor) -> (index, data) of the kernel's pcie index/data pair as (segment, dword offset in it):
#: nbio_v2_3.c, nbio_v6_1.c, nbio_v7_0.c, nbio_v7_4.c use PCIE_INDEX2/PCIE_DATA2 (0xe, 0xf in segment 0); nbio_v4_3.c
#: and nbif_v6_3_1.c use BIF_BX_PF0_RSMU_INDEX/RSMU_DATA (0x0, 0x1 in segment 1)
SMN_PAIRS = {
  (2, 3): ((0, 0xE), (0, 0xF)), (6, 1): ((0, 0xE), (0, 0xF)), (7, 0): ((0, 0xE), (0, 0xF)), (7, 4): ((0, 0xE), (0, 0xF)),
  (4, 3): ((1, 0x0), (1, 0x1)), (6, 3): ((1, 0x0), (1, 0x1)),
}
#: NBIO (major, minor) -> (BIF_BX0_REMAP_HDP_MEM_FLUSH_CNTL, BIF_BX0_REMAP_HDP_REG_FLUSH_CNTL, segment)
#: (nbio_4_3_0_offset.h, nbif_6_3_1_offset.h)
HDP_REMAP = {(4, 3): (0x12D, 0x12E, 2), (6, 3): (0x12D, 0x12E, 2)}
#: NBIO (major, minor) -> doorbell-routing register -> (dword offset, segment, value or field bit): NBIO 4.3 as
#: nbio_v4_3_enable_doorbell_aperture and nbio_v4_3_gc_doorbell_init write them (nbio_v4_3.c, nbio_4_3_0_offset.h);
#: NBIF 6.3.1 (RDNA4, soc24): the same aperture bit at segment 2 + 0xc0 (nbif_v6_3_1_enable_doorbell_aperture), the
#: same entry values in GDC_S2A0_S2A_DOORBELL_ENTRY_0/3_CTRL at segment 2 + 0x1cb / 0x1ce (nbif_v6_3_1_gc_doorbell_init in
#: nbif_v6_3_1.c; nbif_6_3_1_offset.h, BIF_DOORBELL_APER_EN mask 0x1 in nbif_6_3_1_sh_mask.h)
DOORBELL = {(4, 3): {"RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN": (0xC0, 2, 0x1),
                     "S2A_DOORBELL_ENTRY_0_CTRL": (0x4F7740, 3, 0x30000007), "S2A_DOORBELL_ENTRY_3_CTRL": (0x4F7743, 3, 0x3000000D)},
            (6, 3): {"RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN": (0xC0, 2, 0x1),
                     "S2A_DOORBELL_ENTRY_0_CTRL": (0x1CB, 2, 0x30000007), "S2A_DOORBELL_ENTRY_3_CTRL": (0x1CE, 2, 0x3000000D)}}
#: NBIO (major, minor) -> (RCC_STRAP0_RCC_DEV0_EPF0_STRAP0 dword offset, segment, STRAP_ATI_REV_ID_DEV0_F0 mask), what
#: nbif_v6_3_1_get_rev_id reads (nbif_v6_3_1.c; nbif_6_3_1_offset.h, nbif_6_3_1_sh_mask.h)
REV_ID = {(6, 3): (0x1C, 2, 0x0F000000)}
