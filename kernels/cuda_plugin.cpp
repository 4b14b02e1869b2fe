#include "cuda_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace pslab {

namespace {

struct Plugin {
  void* handle = nullptr;
  std::string why;  // when handle is null
};

#ifdef PSLAB_HAVE_CUDA
// The directory of this process's binary ("" if /proc cannot say).
std::string binary_dir() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return "";
  const std::string exe(buf.data(), std::size_t(n));
  return exe.substr(0, exe.rfind('/'));
}
#endif

Plugin load([[maybe_unused]] const std::string& file) {
  Plugin p;
#ifndef PSLAB_HAVE_CUDA
  p.why = "this build of pslab has no CUDA backend (nvcc was not found when CMake configured the build)";
#else
  std::vector<std::string> dirs;
  const char* env = std::getenv("PSLAB_CUDA_PLUGIN_DIR");
  if (env && *env) {
    dirs = {env};
  } else {
    const std::string dir = binary_dir();
    dirs = {dir + "/../kernels", dir + "/../lib"};
  }
  std::string tried;
  for (const std::string& dir : dirs) {
    const std::string path = dir + "/" + file;
    if (access(path.c_str(), F_OK) != 0) {
      tried += (tried.empty() ? "" : "; ") + path + ": not there";
      continue;
    }
    // RTLD_NOW: a symbol it misses is an error here, not a crash in the middle of a run.
    p.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!p.handle) {
      const char* e = dlerror();
      tried += (tried.empty() ? "" : "; ") + (e ? std::string(e) : path + ": dlopen failed");
      continue;
    }
    const auto interface = reinterpret_cast<int (*)()>(dlsym(p.handle, "pslab_plugin_interface"));
    const int built = interface ? interface() : 0;
    if (built == kPluginInterface) return p;
    dlclose(p.handle);
    p.handle = nullptr;
    tried += (tried.empty() ? "" : "; ") + path + ": built by another pslab (plugin interface " +
             (interface ? std::to_string(built) : std::string("unknown")) + ", this binary's " +
             std::to_string(kPluginInterface) + "): rebuild it with this one";
  }
  p.why = "the CUDA plugin " + file + " cannot be loaded (" + tried + (env && *env ? ", from $PSLAB_CUDA_PLUGIN_DIR" : "") + ")";
#endif
  return p;
}

}  // namespace

void* cuda_plugin_symbol(const char* file, const char* name, std::string* why) {
  static std::mutex mu;
  static std::map<std::string, Plugin> loaded;  // by file, loaded once (never unloaded)
  const Plugin* plugin;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = loaded.find(file);
    if (it == loaded.end()) it = loaded.emplace(file, load(file)).first;
    plugin = &it->second;
  }
  if (!plugin->handle) {
    if (why) *why = plugin->why;
    return nullptr;
  }
  void* f = dlsym(plugin->handle, name);
  if (!f && why) *why = std::string("the CUDA plugin ") + file + " has no entry point " + name + " (a plugin of another build?)";
  return f;
}

}  // namespace pslab
