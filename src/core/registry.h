// A registry of the named implementations of one seam: modes (cluster.mode), push codecs
// (cluster.codec), transports (cluster.transport), models (model.kind), optimizers
// (optimizer.kind) and the host collective of each transport. The config names an
// implementation as "name" or "name:argument" (e.g. "ssp:2"); the registry creates it.
//
// Built-in implementations are listed in their seam's registry file, one line each
// (ps/modes/registry.cpp, ps/codecs/registry.cpp, comm/transport/registry.cpp, ...). A test or
// an extension adds its own with add(), e.g. from a static Registrar in its own file; nothing
// else has to change.
//
// Factories take only the argument text, so that creating an implementation is cheap and
// side-effect free: check() validates a name by creating it and throwing it away.
//
// Threading: add() runs before any thread looks names up (static initialisation or main);
// after that, every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace pslab {

template <typename T>
class Registry {
 public:
  // Creates the implementation from its argument ("" when none was given); throws
  // std::invalid_argument saying what the argument should be.
  using Factory = std::function<std::unique_ptr<T>(const std::string& argument)>;
  struct Entry {
    std::string name;   // "ssp"
    std::string usage;  // as shown in errors and --keys, e.g. "ssp:<s>"
    std::string help;   // one line
    bool takes_argument = false;
    Factory make;
    std::string example = "";  // an argument it takes, e.g. "2" for ssp:<s> (to make one for a listing)
    // "ssp:2": a spec that makes this implementation.
    std::string example_spec() const { return takes_argument ? name + ":" + example : name; }
  };

  // `what` names the seam in errors, e.g. "consistency rule".
  Registry(std::string what, std::vector<Entry> builtins) : what_(std::move(what)), entries_(std::move(builtins)) {}

  void add(Entry e) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& x : entries_)
      if (x.name == e.name) throw std::logic_error(what_ + " \"" + e.name + "\" is registered twice");
    entries_.push_back(std::move(e));
  }

  // "name" or "name:argument" -> a new implementation. Throws std::invalid_argument naming
  // the registered choices, or what the argument should be.
  std::unique_ptr<T> make(const std::string& spec) const {
    const auto colon = spec.find(':');
    const std::string name = spec.substr(0, colon);
    const std::string arg = colon == std::string::npos ? std::string() : spec.substr(colon + 1);
    const Entry* e = find(name);
    if (!e) throw std::invalid_argument("\"" + spec + "\" is not a " + what_ + ": expected " + choices());
    if (e->takes_argument && colon == std::string::npos)
      throw std::invalid_argument("\"" + spec + "\" needs an argument: " + e->usage + " (" + e->help + ")");
    if (!e->takes_argument && colon != std::string::npos)
      throw std::invalid_argument("\"" + spec + "\": " + name + " takes no argument");
    try {
      return e->make(arg);
    } catch (const std::invalid_argument& x) {
      throw std::invalid_argument("\"" + spec + "\": " + x.what() + " (" + e->usage + ": " + e->help + ")");
    }
  }
  void check(const std::string& spec) const { (void)make(spec); }

  // "\"bsp\", \"ssp:<s>\" or \"asp\"".
  std::string choices() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (i) s += i + 1 == entries_.size() ? " or " : ", ";
      s += "\"" + entries_[i].usage + "\"";
    }
    return s;
  }
  // One line per entry: usage and help.
  std::vector<Entry> entries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_;
  }

 private:
  const Entry* find(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }
  std::string what_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

// Adds an entry at static initialisation: `static Registrar<Mode> r(mode_registry(), {...});`
template <typename T>
struct Registrar {
  Registrar(Registry<T>& registry, typename Registry<T>::Entry e) { registry.add(std::move(e)); }
};

}  // namespace pslab
