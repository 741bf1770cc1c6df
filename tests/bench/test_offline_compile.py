"""The offline-compile helper's readings of SASS: local-memory instructions inside loops."""

from __future__ import annotations

from benchmarks.offline_compile import _local_memory_in_loops

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
