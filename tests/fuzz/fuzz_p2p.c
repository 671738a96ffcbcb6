/* fuzz_p2p.c - fuzz entry point for the TCP mesh's frame reader
 * (sched/comm/p2p_tcp.c): any bytes a peer sends are read or refused with a
 * message, never a crash, a hang or an allocation larger than what came.
 * The bytes arrive as rank 1's connection to rank 0 of a mesh of 3, with
 * receives posted for channel 1, tags 0, 1, 2 (0, 16 and 1000 bytes). */
#include <stdint.h>
#include <stdlib.h>

#include "../../io/util.h"
#include "../../sched/comm/p2p.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	set_error_quiet(1);
	if (p2p_tcp_fuzz(data, size) < 0)
		abort(); /* no socket pair: the harness itself is broken */
	return 0;
}
