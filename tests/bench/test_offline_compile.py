"""The offline-compile helper's readings of SASS: local-memory instructions inside loops,
Hopper wgmma pipelines that ptxas serialised, and the order of a loop's tensor-core work."""

from __future__ import annotations

from benchmarks.offline_compile import _local_memory_in_loops, _wgmma_serialized, loop_schedule

# cuobjdump -sass lines as they come: an address comment, the instruction, its encoding.
PROLOGUE_STORE = """
        /*0080*/                   STL [R1], R34 ;                          /* 0x0000002201 */
        /*0100*/                   IMAD R3, R2, 0x10, RZ ;                   /* 0x0000000001 */
        /*0200*/                   FFMA R4, R3, R3, R4 ;                     /* 0x0000000001 */
        /*0300*/               @P3 BRA 0x100 ;                               /* 0x0000000001 */
        /*0400*/                   LDL.LU R32, [R1] ;                        /* 0x0000000001 */
        /*0500*/                   EXIT ;                                    /* 0x0000000001 */
        /*0510*/                   BRA 0x510;                                /* 0x0000000001 */
"""


def test_spills_before_and_after_the_loop_are_not_in_it():
    assert not _local_memory_in_loops(PROLOGUE_STORE)


def test_a_spill_inside_a_backward_branch_range_is_in_a_loop():
    inside = PROLOGUE_STORE.replace("FFMA R4, R3, R3, R4", "LDL R4, [R1+0x8]")
    assert _local_memory_in_loops(inside)


def test_uniform_predicated_backward_branches_count_as_loops():
    # Triton's pipelined loops often close with `BRA.U UP0, target` or `BRA.U !UP0, target`.
    text = PROLOGUE_STORE.replace("@P3 BRA 0x100", "BRA.U UP0, 0x100").replace(
        "FFMA R4, R3, R3, R4", "STL [R1+0x4], R4"
    )
    assert _local_memory_in_loops(text)


def _wgmma_group(k_steps: int, wait_each: bool) -> str:
    step = "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR12], R88 ;\n"
    wait = "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
    body = "".join(step + (wait if wait_each else "") for _ in range(k_steps))
    return "WARPGROUP.ARRIVE ;\n" + body + ("" if wait_each else wait)


def test_one_wait_per_group_of_wgmma_k_steps_is_a_pipeline():
    sass = _wgmma_group(8, wait_each=False) + "MUFU.EX2 R1, R2 ;\n" + _wgmma_group(8, False)
    assert not _wgmma_serialized(sass)


def test_a_wait_after_every_wgmma_is_serialised():
    assert _wgmma_serialized(_wgmma_group(8, wait_each=True) + _wgmma_group(4, wait_each=True))
    assert not _wgmma_serialized("FFMA R4, R3, R3, R4 ;\n")  # no wgmma at all


# A prologue copy, then a loop: a TMA wait, two wgmma k-steps and their wait, the exponentials,
# a barrier and the next tile's copy; then an epilogue wgmma outside the loop.
KEY_LOOP = """
        /*0080*/                   UTMALDG.2D [UR8], [UR4] ;                 /* 0x0000000001 */
        /*0100*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [UR5], R2 ;  /* 0x01 */
        /*0110*/                   WARPGROUP.ARRIVE ;                        /* 0x0000000001 */
        /*0120*/                   HGMMA.64x32x16.F32.BF16 R88, gdesc[UR12], RZ ;  /* 0x01 */
        /*0130*/                   HGMMA.64x32x16.F32.BF16 R88, gdesc[UR16], R88 ; /* 0x01 */
        /*0140*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;           /* 0x0000000001 */
        /*0150*/                   MUFU.EX2 R4, R4 ;                         /* 0x0000000001 */
        /*0160*/                   MUFU.EX2 R5, R5 ;                         /* 0x0000000001 */
        /*0170*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;             /* 0x0000000001 */
        /*0180*/               @P2 UTMALDG.2D [UR8], [UR4] ;                 /* 0x0000000001 */
        /*0190*/               @P0 BRA 0x100 ;                               /* 0x0000000001 */
        /*0200*/                   HGMMA.64x64x16.F32.BF16 R24, R120, gdesc[UR8], R24 ; /* 0x */
        /*0210*/                   EXIT ;                                    /* 0x0000000001 */
"""


def test_loop_schedule_lists_the_loop_s_work_in_order_as_runs():
    assert loop_schedule(KEY_LOOP) == [
        ("SYNCS.PHASECHK", 1),
        ("HGMMA.64x32x16", 2),
        ("WARPGROUP.DEPBAR", 1),
        ("MUFU.EX2", 2),
        ("BAR.SYNC", 1),
        ("UTMALDG.2D", 1),
    ]
    assert loop_schedule(KEY_LOOP.replace("@P0 BRA 0x100", "NOP")) == []  # no loop
