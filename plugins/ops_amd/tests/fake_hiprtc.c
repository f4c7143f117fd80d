/* A stand-in for ROCm's libhiprtc.so with its C signatures, for testing plugrt_amd.hip's ctypes binding where ROCm is
   not installed: "compiling" returns the source itself as the code; a source containing SYNTAX_ERROR fails with a log. */
#include <stdlib.h>
#include <string.h>

typedef struct { char *src; } prog_t;
static char last_options[4096];

int hiprtcCreateProgram(void **prog, const char *src, const char *name, int n, const char **headers, const char **names) {
  prog_t *p = calloc(1, sizeof *p);
  if (!p || !src || !name || n != 0) return 3;
  p->src = strdup(src);
  *prog = p;
  return 0;
}
int hiprtcCompileProgram(void *prog, int n, const char **options) {
  last_options[0] = 0;
  for (int i = 0; i < n; i++) { strncat(last_options, options[i], 1000); strcat(last_options, " "); }
  return strstr(((prog_t *)prog)->src, "SYNTAX_ERROR") ? 6 : 0;
}
int hiprtcGetProgramLogSize(void *prog, size_t *n) { *n = 18; return 0; }
int hiprtcGetProgramLog(void *prog, char *log) { strcpy(log, "error: bad syntax"); return 0; }
int hiprtcGetCodeSize(void *prog, size_t *n) { *n = strlen(((prog_t *)prog)->src); return 0; }
int hiprtcGetCode(void *prog, char *code) { memcpy(code, ((prog_t *)prog)->src, strlen(((prog_t *)prog)->src)); return 0; }
int hiprtcDestroyProgram(void **prog) { prog_t *p = *prog; free(p->src); free(p); *prog = 0; return 0; }
const char *hiprtcGetErrorString(int status) { return status == 6 ? "HIPRTC_ERROR_COMPILATION" : "HIPRTC_ERROR_OTHER"; }
int hiprtcVersion(int *major, int *minor) { *major = 6; *minor = 2; return 0; }
const char *fake_last_options(void) { return last_options; }
