/* tensorboard.h - TensorBoard event files, scalars only, without Python.
 *
 * An event file is a TFRecord stream: each record is
 *   uint64 length (little-endian), uint32 masked_crc32c(length bytes),
 *   length bytes of data, uint32 masked_crc32c(data),
 * masked_crc(x) = ((crc32c(x) >> 15) | (crc32c(x) << 17)) + 0xa282ead8,
 * and each data is a serialised tensorflow.Event protocol buffer:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * The first record carries file_version "brain.Event:2". Files are named
 * events.out.tfevents.SECONDS.HOST.PID so that TensorBoard, pointed at the
 * directory (or a parent), finds every run's file.
 */
#ifndef ASYNCPP_TENSORBOARD_H
#define ASYNCPP_TENSORBOARD_H

#include <stdio.h>

struct tb_writer {
	FILE *fp;
	char *path;
};

/* Create DIR (one level) if needed and a new event file in it. Returns 0,
 * or -1 after error() naming the file. */
int tb_open(struct tb_writer *tb, const char *dir);
/* One scalar: tag (e.g. "train/loss") at step, wall_time in Unix seconds.
 * Flushed at once, so a dashboard follows the run. */
int tb_scalar(struct tb_writer *tb, const char *tag, long step, double wall_time, float value);
void tb_close(struct tb_writer *tb);
/* Close and remove the events file (a run refused after tb_open); nothing
 * when none is open. */
void tb_discard(struct tb_writer *tb);

#endif
