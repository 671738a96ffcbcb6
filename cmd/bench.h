/* bench.h - benchmark families of `asyncpp bench`, one file each. */
#ifndef ASYNCPP_BENCH_H
#define ASYNCPP_BENCH_H
int bench_kernels(int argc, char **argv);   /* cmd/bench_kernels.c */
int bench_train(int argc, char **argv);     /* cmd/bench_train.c */
int bench_schedule(int argc, char **argv);  /* cmd/bench_schedule.c */
int bench_tokenizer(int argc, char **argv); /* cmd/bench_tokenizer.c */
int bench_plan(int argc, char **argv);      /* cmd/bench_plan.c */
#endif
