#include "nvml_sampler.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>

namespace fccli {

namespace {
constexpr int kNvmlClockSm = 1;           // NVML_CLOCK_SM
constexpr int kNvmlTemperatureGpu = 0;    // NVML_TEMPERATURE_GPU
}  // namespace

PowerSampler::PowerSampler(const std::string& pci_bus_id, int period_ms) : period_ms_(period_ms) {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    why_ = "libnvidia-ml.so.1 not found";
    return;
  }
  auto sym = [&](const char* name) { return dlsym(lib_, name); };
  init_ = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  shutdown_ = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  by_pci_ = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  power_ = reinterpret_cast<int (*)(void*, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
  clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetClockInfo"));
  temp_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetTemperature"));
  if (!init_ || !shutdown_ || !by_pci_ || !power_ || !clock_ || !temp_) {
    why_ = "NVML symbols missing";
    dlclose(lib_);
    lib_ = nullptr;
    return;
  }
  if (init_() != 0) {
    why_ = "nvmlInit failed";
    dlclose(lib_);
    lib_ = nullptr;
    return;
  }
  void* dev = nullptr;
  if (by_pci_(pci_bus_id.c_str(), &dev) != 0 || !dev) {
    why_ = "NVML has no device with PCI bus id " + pci_bus_id;
    return;
  }
  device_ = dev;
}

PowerSampler::~PowerSampler() {
  if (running_) stop();
  if (lib_) {
    shutdown_();
    dlclose(lib_);
  }
}

PowerSampler::Sample PowerSampler::sample_once() {
  Sample s;
  s.has_power = power_(device_, &s.power_mw) == 0;
  s.has_clock = clock_(device_, kNvmlClockSm, &s.sm_mhz) == 0;
  s.has_temp = temp_(device_, kNvmlTemperatureGpu, &s.temp_c) == 0;
  return s;
}

void PowerSampler::loop() {
  while (running_.load()) {
    Sample s = sample_once();
    {
      std::lock_guard<std::mutex> lock(mu_);
      samples_.push_back(s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(period_ms_));
  }
}

void PowerSampler::start() {
  if (!available() || running_) return;
  samples_.clear();
  running_ = true;
  thread_ = std::thread(&PowerSampler::loop, this);
}

PowerStats PowerSampler::stop() {
  PowerStats st;
  if (!available()) return st;
  if (running_) {
    running_ = false;
    thread_.join();
  }
  samples_.push_back(sample_once());
  int np = 0, nc = 0, nt = 0;
  double sp = 0, sc = 0, stemp = 0;
  st.sm_clock_min_mhz = 1 << 30;
  for (const Sample& s : samples_) {
    if (s.has_power) {
      ++np;
      sp += s.power_mw / 1000.0;
      st.power_peak_w = std::max(st.power_peak_w, s.power_mw / 1000.0);
    }
    if (s.has_clock) {
      ++nc;
      sc += s.sm_mhz;
      st.sm_clock_min_mhz = std::min<int>(st.sm_clock_min_mhz, static_cast<int>(s.sm_mhz));
    }
    if (s.has_temp) {
      ++nt;
      stemp += s.temp_c;
      st.temp_max_c = std::max<int>(st.temp_max_c, static_cast<int>(s.temp_c));
    }
  }
  if (nc == 0) st.sm_clock_min_mhz = 0;
  st.samples = static_cast<int>(samples_.size());
  st.valid = np > 0;
  if (np) st.power_mean_w = sp / np;
  if (nc) st.sm_clock_mean_mhz = sc / nc;
  if (nt) st.temp_mean_c = stemp / nt;
  return st;
}

}  // namespace fccli
