/*
 * htp_bridge.c: a stand-in libQnnHtp.so that lets ExecuTorch 1.5.1 drive newer x86_64 QNN HTP
 * libraries (QNN 2.51, from PyPI's onnxruntime-qnn 2.7.0) for ahead-of-time compilation and HTP
 * emulation on x86.
 *
 * NOT for devices. It exists because no Qualcomm SDK matching ExecuTorch 1.5.1 (QNN 2.37) can be
 * downloaded on these machines. A user with a matching SDK sets QNN_SDK_ROOT and never loads this.
 *
 * The one incompatibility it bridges: ExecuTorch passes HTP device custom configs
 * (QnnHtpDevice_CustomConfig_t) in the QNN 2.37 layout, 12 bytes:
 *     { uint32 option; union (4-byte aligned) { uint32 socModel; ... } }   value at byte 4
 * Between QNN 2.37 and 2.47 a `void* htpExtension` joined that union, so it became 8-byte aligned
 * and QNN 2.47+ reads the value at byte 8 (a 16-byte struct). Unbridged, deviceCreate fails with
 * "unknown custom config socModel 0" and error 14001.
 *
 * How: this library carries the SONAME libQnnHtp.so, so both ways ExecuTorch loads the backend
 * find it (the AOT compiler dlopens $QNN_SDK_ROOT/lib/x86_64-linux-clang/libQnnHtp.so by full
 * path; the runtime dlopens the bare name, satisfied by a preload). It dlopens the real library,
 * renamed REAL_LIB_NAME beside it, forwards QnnInterface_getProviders, and replaces the provider
 * table's deviceCreate entry with a wrapper that rewrites each HTP custom config into the new
 * layout before calling the real deviceCreate.
 *
 * Offsets relied on (QnnInterface_t / QnnDevice_Config_t, checked against QNN 2.51 at runtime):
 *   QnnInterface_t: uint32 backendId @0, const char* providerName @8, Qnn_ApiVersion_t (six
 *                   uint32) @16, then the function table @40; deviceCreate is entry 40.
 *   QnnDevice_Config_t: uint32 option @0 (0 = custom), void* customConfig @8.
 *
 * Link with -z nodelete: ExecuTorch dlcloses the library after probing its build id but keeps
 * the interface pointers it obtained.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef REAL_LIB_NAME
#define REAL_LIB_NAME "libQnnHtp.real.so"
#endif

#define FUNCTION_TABLE_OFFSET 40
#define DEVICE_CREATE_INDEX 40
#define DEVICE_CONFIG_OPTION_CUSTOM 0u
#define OLD_CUSTOM_CONFIG_SIZE 12
#define NEW_CUSTOM_CONFIG_SIZE 16
#define MAX_CONFIGS 64

typedef uint64_t Qnn_ErrorHandle_t;
typedef int (*GetProvidersFn)(const void ***provider_list, uint32_t *num_providers);
typedef Qnn_ErrorHandle_t (*DeviceCreateFn)(void *logger, const void **config, void **device);

typedef struct {
  uint32_t option;
  uint32_t pad;
  void *custom_config;
} DeviceConfig; /* QnnDevice_Config_t */

static void *real_handle;
static GetProvidersFn real_get_providers;
static DeviceCreateFn real_device_create;

static int debug_enabled(void) {
  const char *v = getenv("QNN_HTP_BRIDGE_DEBUG");
  return v != NULL && v[0] != '\0' && v[0] != '0';
}

#define DEBUG(...)                                \
  do {                                            \
    if (debug_enabled()) {                        \
      fprintf(stderr, "[qnn-htp-bridge] " __VA_ARGS__); \
      fputc('\n', stderr);                        \
    }                                             \
  } while (0)

static int load_real(void) {
  if (real_get_providers != NULL) return 0;
  Dl_info info;
  if (dladdr((void *)&load_real, &info) == 0 || info.dli_fname == NULL) {
    fprintf(stderr, "[qnn-htp-bridge] cannot find this library's own path\n");
    return -1;
  }
  char path[4096];
  const char *slash = strrchr(info.dli_fname, '/');
  size_t dir_len = slash ? (size_t)(slash - info.dli_fname) : 0;
  if (dir_len + 1 + sizeof(REAL_LIB_NAME) > sizeof(path)) return -1;
  if (dir_len) memcpy(path, info.dli_fname, dir_len);
  else path[0] = '.', dir_len = 1;
  path[dir_len] = '/';
  memcpy(path + dir_len + 1, REAL_LIB_NAME, sizeof(REAL_LIB_NAME));
  real_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (real_handle == NULL) {
    fprintf(stderr, "[qnn-htp-bridge] cannot load the real QNN HTP library %s: %s\n", path,
            dlerror());
    return -1;
  }
  real_get_providers = (GetProvidersFn)dlsym(real_handle, "QnnInterface_getProviders");
  if (real_get_providers == NULL) {
    fprintf(stderr, "[qnn-htp-bridge] %s has no QnnInterface_getProviders\n", path);
    return -1;
  }
  DEBUG("loaded %s", path);
  return 0;
}

/* deviceCreate with every custom config moved from the 12-byte into the 16-byte layout. */
static Qnn_ErrorHandle_t bridged_device_create(void *logger, const void **config, void **device) {
  if (config == NULL) return real_device_create(logger, config, device);
  const void *new_list[MAX_CONFIGS + 1];
  DeviceConfig new_configs[MAX_CONFIGS];
  unsigned char new_custom[MAX_CONFIGS][NEW_CUSTOM_CONFIG_SIZE];
  size_t n = 0;
  for (; config[n] != NULL; n++) {
    if (n == MAX_CONFIGS) {
      fprintf(stderr, "[qnn-htp-bridge] more than %d device configs\n", MAX_CONFIGS);
      return real_device_create(logger, config, device);
    }
    const DeviceConfig *old = (const DeviceConfig *)config[n];
    new_configs[n] = *old;
    if (old->option == DEVICE_CONFIG_OPTION_CUSTOM && old->custom_config != NULL) {
      const unsigned char *src = (const unsigned char *)old->custom_config;
      memset(new_custom[n], 0, NEW_CUSTOM_CONFIG_SIZE);
      memcpy(new_custom[n], src, 4);      /* option */
      memcpy(new_custom[n] + 8, src + 4, 8); /* the union: value(s) at byte 4 -> byte 8 */
      new_configs[n].custom_config = new_custom[n];
      DEBUG("device custom config: option %u value %u moved to offset 8",
            *(const uint32_t *)src, *(const uint32_t *)(src + 4));
    }
    new_list[n] = &new_configs[n];
  }
  new_list[n] = NULL;
  return real_device_create(logger, new_list, device);
}

static int patch_slot(void **slot) {
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t start = (uintptr_t)slot & ~(uintptr_t)(page - 1);
  uintptr_t end = ((uintptr_t)(slot + 1) + page - 1) & ~(uintptr_t)(page - 1);
  if (mprotect((void *)start, end - start, PROT_READ | PROT_WRITE) != 0) {
    perror("[qnn-htp-bridge] mprotect");
    return -1;
  }
  *slot = (void *)&bridged_device_create;
  return 0;
}

__attribute__((visibility("default"))) int QnnInterface_getProviders(const void ***provider_list,
                                                                     uint32_t *num_providers) {
  if (load_real() != 0) return 1; /* QNN_INTERFACE_ERROR_... : any non-zero is a failure */
  int status = real_get_providers(provider_list, num_providers);
  if (status != 0 || provider_list == NULL || *provider_list == NULL || num_providers == NULL)
    return status;
  for (uint32_t i = 0; i < *num_providers; i++) {
    unsigned char *iface = (unsigned char *)(*provider_list)[i];
    if (iface == NULL) continue;
    void **slot = (void **)(iface + FUNCTION_TABLE_OFFSET + DEVICE_CREATE_INDEX * sizeof(void *));
    if (*slot == (void *)&bridged_device_create) continue; /* patched by an earlier call */
    if (real_device_create == NULL) real_device_create = (DeviceCreateFn)*slot;
    if (patch_slot(slot) != 0) return 1;
    DEBUG("provider %u: deviceCreate bridged", i);
  }
  return status;
}
