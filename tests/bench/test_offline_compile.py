"""The offline-compile helper's readings of SASS: local-memory instructions inside loops, and
Hopper wgmma pipelines that ptxas serialised."""

from __future__ import annotations

from benchmarks.offline_compile import _local_memory_in_loops, _wgmma_serialized

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
