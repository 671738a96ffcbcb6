/* staged.h - what a command has written but not yet moved into place,
 * removed when a signal ends the command.
 *
 * Every writer stages its output (util.h's atomic files: "PATH.tmp.PID";
 * tokenize's "PATH.pass.PID", export's "DIR/.partial.PID/") and moves it in
 * only once it is whole, so an error never leaves a half-written file where
 * the user looks. A signal (Ctrl-C, kill, a job scheduler's SIGTERM, a
 * closed terminal) would still leave the staged files behind; like zstd's
 * command line, asyncpp removes them before it dies:
 *
 *     staged_on_signals();          main(), once: SIGINT, SIGTERM, SIGHUP
 *     staged_add(path, 0);          a file (or, 1, a folder) now exists
 *     ...
 *     staged_drop(path);            moved into place or removed
 *
 * The handler unlinks every file still staged, then removes the staged
 * folders (rmdir: only when empty), says so on stderr and dies by the same
 * signal, so the exit status is the signal's. die() and dist_abort() (a
 * rank that ends the job when a peer died) remove them too before they
 * exit. A file committed into a staged folder (atomic_commit) stays staged
 * until its folder is dropped.
 *
 * Slots are fixed (STAGED_MAX): the handler may not allocate. When they are
 * all taken a path is simply not tracked, which is today's behaviour of a
 * killed writer, never a loss. SIGKILL cannot be caught; train (which
 * handles SIGINT/SIGTERM/SIGHUP itself, to stop at a step and checkpoint)
 * removes its dead writers' temporaries on the next start
 * (cmd/train_dir.c).
 *
 * A file size limit (ulimit -f) is turned from a killing SIGXFSZ into a
 * write error (EFBIG), which every writer reports with the file's name and
 * cleans up after like any other failed write.
 */
#ifndef ASYNCPP_STAGED_H
#define ASYNCPP_STAGED_H

#define STAGED_MAX 64 /* at most 64: the handler keeps a bit per slot */

/* Track path (a file, or a folder when is_dir). Thread-safe. */
void staged_add(const char *path, int is_dir);
/* Stop tracking path; a folder also drops what was tracked inside it. */
void staged_drop(const char *path);
/* A staged file is about to be renamed to path: track path from now if its
 * folder is staged (it is not in place until that folder's files are
 * moved). Called before the rename, so that no moment leaves it untracked;
 * the caller drops the old name after. */
void staged_commit_to(const char *path);

/* Remove everything tracked: files, then folders. Async-signal-safe.
 * Returns how many entries it removed. */
int staged_remove_all(void);

/* Install the handler for SIGINT, SIGTERM and SIGHUP, and make SIGXFSZ a
 * write error. A command that installs its own handler for a signal calls
 * staged_remove_all() before it dies by that signal. */
void staged_on_signals(void);
/* Install handler for sig, unless whoever started the process ignores sig
 * (nohup, a background job of a script): an ignored signal stays ignored. */
void staged_catch(int sig, void (*handler)(int));
/* In a child about to exec another program: SIGXFSZ as that program
 * expects it (an ignored signal stays ignored across exec). */
void staged_children_default(void);

#endif
