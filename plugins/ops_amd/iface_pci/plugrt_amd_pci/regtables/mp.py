"""Register tables of the MP1 (SMU) mailbox the bring-up's SMU step uses (plugrt_amd_pci.smu): per MP1 generation,
where the message, argument and response registers are as (dword offset, segment), the segment an index into the MP1
block's register bases from IP discovery.

Data only (plugrt_amd_pci.regtables). Copied by hand from the Linux kernel's SMU drivers
(drivers/gpu/drm/amd/pm/swsmu/smu13/smu_v13_0_0_ppt.c, smu14/smu_v14_0_2_ppt.c) and
drivers/gpu/drm/amd/include/asic_reg/mp/mp_14_0_2_offset.h, as each table's comment says.
"""

#: MP1 13.0.x: (offset, segment) of C2PMSG_66 (message), C2PMSG_82 (argument), C2PMSG_90 (response) (the local defines
#: of smu_v13_0_0_ppt.c's set_smu_mailbox_registers)
MAILBOX_13 = ((0x282, 0), (0x292, 0), (0x29A, 0))
#: MP1 14.0.x: the same three registers (mp_14_0_2_offset.h, as smu_v14_0_2_ppt.c uses them)
MAILBOX_14 = ((0x82, 1), (0x92, 1), (0x9A, 1))
